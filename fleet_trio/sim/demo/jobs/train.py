"""The demo node's ``train`` task: prints one line per epoch; on SIGTERM it "writes a
checkpoint" (half a second) and exits 143.
"""

import json
import signal
import sys
import time


def main() -> None:
    payload = json.loads(sys.stdin.read() or "{}")
    epochs = int(payload.get("epochs", 100))

    def on_term(signum: int, frame: object) -> None:
        print(
            "train: SIGTERM received, writing a checkpoint before exiting",
            file=sys.stderr,
            flush=True,
        )
        time.sleep(0.5)
        sys.exit(143)

    signal.signal(signal.SIGTERM, on_term)
    for i in range(1, epochs + 1):
        print(f"epoch {i}/{epochs}", file=sys.stderr, flush=True)
        time.sleep(0.25)
    print(json.dumps({"epochs": epochs}))


if __name__ == "__main__":  # a script run by the demo; importing it runs nothing
    main()
