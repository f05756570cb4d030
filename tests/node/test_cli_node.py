"""``fleet-trio node`` on the command line: refusals, and a real run with the fake GPU."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import httpx
import pytest
import trio

from fleet_trio.cli import main
from fleet_trio.gpu.fake import init_device
from fleet_trio.sim.fleet import free_port
from tests.helpers import answer, fleet_trio_process, state_in, wait_until

REPO = Path(__file__).resolve().parents[2]


def test_refuses_non_loopback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["node", "--listen", "0.0.0.0:18811"]) == 1
    assert 'refusing to bind --listen "0.0.0.0:18811"' in capsys.readouterr().err


def test_refuses_an_unusable_fake_gpu(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    argv = ["node", "--gpu", "fake", "--fake-gpu-dir", str(blocker / "gpu")]
    assert main([*argv, "--listen", "127.0.0.1:0"]) == 1
    err = capsys.readouterr().err
    assert f"error: cannot create the fake GPU in {blocker / 'gpu'}: Not a directory" in err
    assert "Traceback" not in err


def test_bad_config_names_key_and_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cfg = tmp_path / "n.yaml"
    cfg.write_text("node:\n  timings:\n    drain_timeout: 30\n")
    assert main(["node", "-c", str(cfg)]) == 1
    err = capsys.readouterr().err
    assert str(cfg) in err and "node.timings.drain_timeout" in err


@pytest.mark.parametrize(
    ("flags", "env", "config", "said"),
    [
        (
            ["--node-id", "gpu\nbox"],
            {},
            "",
            "error: --node-id: must not contain a control character (found U+000A)",
        ),
        (
            ["--token", "se\x00cret"],
            {},
            "",
            "error: --token: must not contain a control character (found U+0000)",
        ),
        (["--token", "t\u00f6k"], {}, "", "error: --token: must be ASCII (found U+00F6)"),
        (
            [],
            {"FLEET_TRIO_TOKEN": "a\nb"},
            "",
            "error: $FLEET_TRIO_TOKEN: must not contain a control character",
        ),
        (
            [],
            {},
            'node:\n  node_id: "a\\tb"\n',
            "n.yaml: node.node_id: must not contain a control character (found U+0009)",
        ),
    ],
)
def test_a_control_character_in_the_node_id_or_the_token_is_refused(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    flags: list[str],
    env: dict[str, str],
    config: str,
    said: str,
) -> None:
    """The node id reaches the health answer and the journal, the token every request's
    header check (a token no header can carry would refuse every request). The error names
    where the text came from."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    cfg = tmp_path / "n.yaml"
    cfg.write_text(config or "node: {}\n")
    argv = ["node", "-c", str(cfg), "--gpu", "fake", "--fake-gpu-dir", str(tmp_path / "gpu")]
    assert main([*argv, "--no-journal", "--listen", "127.0.0.1:0", *flags]) == 1
    err = capsys.readouterr().err
    assert said in err
    assert "Traceback" not in err


def test_port_in_use_is_a_one_line_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    gpu_dir = tmp_path / "gpu"
    init_device(str(gpu_dir))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["node", "--gpu", "fake", "--fake-gpu-dir", str(gpu_dir)]
        argv += ["--journal", str(tmp_path / "journal.sqlite")]
        assert main([*argv, "--listen", f"127.0.0.1:{port}"]) == 1
    err = capsys.readouterr().err
    assert f"error: cannot listen on 127.0.0.1:{port}: [Errno 98] Address already in use" in err
    assert "Traceback" not in err and "draining" not in err


async def test_real_process_with_fake_gpu(tmp_path: Path) -> None:
    gpu_dir = tmp_path / "gpu"
    init_device(str(gpu_dir))
    port = free_port()
    env = {**os.environ, "FLEET_TRIO_FAKE_GPU_DIR": str(gpu_dir)}
    argv = ["node", "-c", str(REPO / "examples" / "node.yaml"), "--gpu", "fake"]
    argv += ["--listen", f"127.0.0.1:{port}", "--node-id", "cli-node"]
    argv += ["--footprints", str(tmp_path / "fp.json")]
    with trio.fail_after(30):
        async with (
            fleet_trio_process(argv, env=env),
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client,
        ):
            r = await wait_until(lambda: answer(client, "/fleet/health"))
            assert r.status_code == 200
            body = r.json()
            assert body["node_id"] == "cli-node" and body["supported_task_types"] == ["sleepy"]
            r = await client.post(
                "/fleet/dispatch",
                json={"job_id": "j1", "task_type": "sleepy", "payload": {"seconds": 0.3}},
            )
            assert r.status_code == 202
            await wait_until(lambda: state_in(client, "j1", "done", "error"))
            assert (await client.get("/fleet/jobs/j1")).json()["state"] == "done"
