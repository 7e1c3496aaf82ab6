"""Loaded by every Python process the tests start (conftest puts this folder first on PYTHONPATH): a child that
ran vknorm with the validation layer on leaves with status 86, its messages on stderr, when the layer reported
any, as the test process itself fails a test on any message. The check runs at exit, after vknorm's own exit
work (atexit calls the last registered first, and this runs before vknorm is imported), so reports made when
vknorm releases its default devices count too; objects that module globals still hold go later, in the
interpreter's teardown, unseen. VKNORM_TESTS_EXPECT_VALIDATION_MESSAGES=1: a test that provokes messages on
purpose. Forked children that leave with os._exit skip it, as they skip every exit handler."""
import atexit
import os
import sys

VALIDATION_FAILURE_STATUS = 86


def _fail_on_validation_messages():
    core = sys.modules.get("vknorm._core")
    if core is None or os.environ.get("VKNORM_TESTS_EXPECT_VALIDATION_MESSAGES") == "1":
        return
    messages = core.validation_messages()
    if not messages:
        return
    shown = "\n".join(f"  [{i}] {m}" for i, m in enumerate(messages[:10]))
    sys.stderr.write(f"vknorm tests: {len(messages)} Vulkan validation message(s) in child process {os.getpid()} "
                     f"({' '.join(sys.argv)[:200]}):\n{shown}\n")
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(VALIDATION_FAILURE_STATUS)


atexit.register(_fail_on_validation_messages)
