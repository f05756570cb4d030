"""The example task: the payload arrives as JSON on stdin, the result goes to stdout."""

import json
import sys

payload = json.load(sys.stdin)
json.dump({"text": payload["text"].upper()}, sys.stdout)
