"""One rank of ``bluefog.run``: unpickles the function from the environment, runs it, and
prints its result or exception on one marked line (bluefog/run/runner.py)."""

import base64
import os
import sys
import traceback

import cloudpickle


def main() -> int:
    marker = os.environ["BLUEFOG_RUN_MARKER"]
    fn, args, kwargs = cloudpickle.loads(base64.b64decode(os.environ.pop("BLUEFOG_RUN_PAYLOAD")))
    try:
        outcome = ("ok", fn(*args, **kwargs))
        code = 0
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the caller
        text = "".join(traceback.format_exception_only(type(e), e)).strip()
        text += "\n" + "".join(traceback.format_exc())
        try:
            cloudpickle.dumps(e)
            outcome = ("error", e, text)
        except Exception:  # noqa: BLE001 - an exception that cannot travel: its text does
            outcome = ("error", RuntimeError(text), text)
        code = 1
    try:
        data = cloudpickle.dumps(outcome)
    except Exception as e:  # noqa: BLE001
        rank = os.environ.get("RANK")
        err = TypeError(f"rank {rank}: the function's result cannot be pickled: {e}")
        data = cloudpickle.dumps(("error", err, str(err)))
        code = 1
    sys.stdout.flush()
    sys.stdout.write(f"{marker} {base64.b64encode(data).decode()}\n")
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
