"""train.py, except that its second checkpoint save stops halfway through writing the file: it writes
half of the checkpoint's bytes, says so by creating the file named by $STALLED_SAVE_MARK, and waits
to be killed. tests/test_train.py runs it under torchrun, so that its kill lands mid-save every time.
"""
import io
import os
import runpy
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
save = torch.save
saves = 0


def save_half_then_wait(obj, f, *args, **kwargs):
    global saves
    saves += 1
    if saves < 2:
        return save(obj, f, *args, **kwargs)
    whole = io.BytesIO()
    save(obj, whole, *args, **kwargs)
    f.write(whole.getvalue()[:whole.tell() // 2])
    f.flush()  # the half is in the file for whoever reads it after the kill
    open(os.environ["STALLED_SAVE_MARK"], "w").close()
    time.sleep(3600)  # killed long before


torch.save = save_half_then_wait
sys.path[0] = ROOT  # train.py imports the project's modules as when run from the repository root
runpy.run_path(os.path.join(ROOT, "train.py"), run_name="__main__")
