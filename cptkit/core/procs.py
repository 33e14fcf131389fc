"""Writer processes on this host and the temporary files they leave: whether a pid lives, and the
names that carry a writer's pid (``.NAME.<pid>.tmp``, ``.NAME.tmp-<pid>``). The lowest module of
``core/`` beside ``errors``: the shard writer, the fingerprints and the object-store mirror all ask."""

from __future__ import annotations

import os
import re

TMP_PID = re.compile(r"^\..*(?:\.(\d+)\.tmp|\.tmp-(\d+))$")  # .NAME.<pid>.tmp, .NAME.tmp-<pid>


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` lives on this host (another user's live process counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's live process
        return True
    return True
