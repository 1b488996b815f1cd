"""bluefog/run/mpirun_output.py: mpirun --tag-output's chunks made whole lines again. Pure: the
input is what Open MPI 4.1 printed for two ranks writing a line in pieces; the job itself runs
in test_bfrun.py's test_rank_tags_are_on_whole_lines."""

import io

import pytest

from bluefog.run.mpirun_output import WholeLines

RULE = "-" * 74
# Rank 0 and 1 each wrote "    ", "import keras", "\n", "line2\nline3", "\n", "tail".
RECORDED = ("[1,1]<stderr>:    [1,0]<stderr>:    [1,1]<stderr>:import keras[1,0]<stderr>:import "
            "keras[1,1]<stderr>:\n[1,0]<stderr>:\n[1,1]<stderr>:line2\n[1,1]<stderr>:line3"
            "[1,0]<stderr>:line2\n[1,0]<stderr>:line3[1,1]<stderr>:\n[1,0]<stderr>:\n"
            "[1,1]<stderr>:tail")


def whole(text: str, step: int) -> list:
    out = io.BytesIO()
    lines = WholeLines(out)
    data = text.encode()
    for i in range(0, len(data), step):
        lines.feed(data[i:i + step])
    lines.close()
    return out.getvalue().decode().splitlines()


@pytest.mark.parametrize("step", [1, 2, 5, 13, 10_000])
def test_chunks_become_whole_lines(step):
    """However the reads cut the stream (mid-tag included)."""
    assert whole(RECORDED, step) == [
        "[1,1]<stderr>:    import keras", "[1,0]<stderr>:    import keras",
        "[1,1]<stderr>:line2", "[1,0]<stderr>:line2", "[1,1]<stderr>:line3",
        "[1,0]<stderr>:line3", "[1,1]<stderr>:tail"]


@pytest.mark.parametrize("step", [1, 7, 10_000])
def test_mpirun_messages_stay_its_own(step):
    """Untagged text after a newline is mpirun's; so is its message right after a rank's
    partial line. A rank's own rule, at the start of its chunk, stays the rank's."""
    text = (f"[1,0]<stdout>:{RULE}\n[1,0]<stdout>:x [0] y\nmpirun: note\n"
            f"[1,1]<stdout>:partial{RULE}\nPrimary job terminated\n{RULE}\n")
    assert whole(text, step) == [
        f"[1,0]<stdout>:{RULE}", "[1,0]<stdout>:x [0] y", "mpirun: note", RULE,
        "Primary job terminated", RULE, "[1,1]<stdout>:partial"]
