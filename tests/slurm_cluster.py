"""Start a real one-node SLURM cluster (slurmctld + slurmd + munge) under a temp dir.

Needs root and Debian's ``slurm-wlm`` and ``munge`` (``.ci/run`` installs them). Everything —
config, state, logs, the munge socket — lives under the directory given, and clients find it
through ``SLURM_CONF``. Recipe from ../shared/ENVIRONMENT.md.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path


def available() -> str | None:
    """Why a cluster cannot be started here, or None."""
    if os.geteuid() != 0:
        return "needs root (slurmctld, slurmd and munged run as root here): run make test as root"
    for exe in ("slurmctld", "slurmd", "munged", "sbatch"):
        if shutil.which(exe) is None:
            return f"{exe} not installed: make install does it as root (apt-get install slurm-wlm munge)"
    return None


class SlurmCluster:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.host = socket.gethostname()
        self.conf = self.root / "slurm.conf"
        self.pids: list[Path] = []

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self) -> SlurmCluster:
        r = self.root
        r.mkdir(parents=True, exist_ok=True)
        r.chmod(0o755)  # munged runs as the munge user and must reach its socket dir
        for d in ("munge", "state", "spool", "log"):
            (r / d).mkdir(parents=True, exist_ok=True)
        munge_dir = r / "munge"
        shutil.chown(munge_dir, "munge", "munge")
        munge_dir.chmod(0o711)
        key = munge_dir / "munge.key"
        if Path("/etc/munge/munge.key").exists():
            shutil.copy("/etc/munge/munge.key", key)
        else:
            key.write_bytes(os.urandom(1024))
        shutil.chown(key, "munge", "munge")
        key.chmod(0o400)
        sock = munge_dir / "munge.socket.2"
        subprocess.run(["runuser", "-u", "munge", "--", "munged", f"--socket={sock}", f"--key-file={key}",
                        f"--pid-file={munge_dir / 'munged.pid'}", f"--log-file={munge_dir / 'munged.log'}",
                        f"--seed-file={munge_dir / 'munged.seed'}", "--force"], check=True)
        self.pids.append(munge_dir / "munged.pid")
        node = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
        port = 7000 + os.getpid() % 1000
        self.conf.write_text("\n".join([
            "ClusterName=cptkit", f"SlurmctldHost={self.host}", "SlurmUser=root", "SlurmdUser=root",
            f"SlurmctldPort={port}", f"SlurmdPort={port + 1}",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={sock}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "MpiDefault=none", "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "ReturnToService=2",
            f"StateSaveLocation={r / 'state'}", f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}", f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log/slurmctld.log'}", f"SlurmdLogFile={r / 'log/slurmd.log'}",
            "MaxArraySize=1001", node,
            f"PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP", ""]))
        subprocess.run(["slurmctld", "-f", str(self.conf)], env=self.env, check=True)
        self.pids.append(r / "slurmctld.pid")
        subprocess.run(["slurmd", "-f", str(self.conf)], env=self.env, check=True)
        self.pids.append(r / "slurmd.pid")
        deadline = time.time() + 60
        while time.time() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True)
            if out.returncode == 0 and out.stdout.strip() in ("idle", "mixed", "allocated"):
                return self
            time.sleep(0.5)
        raise RuntimeError(f"SLURM did not come up: {out.stdout} {out.stderr}\n"
                           + (r / "log/slurmctld.log").read_text()[-2000:])

    def stop(self) -> None:
        for pid_file in reversed(self.pids):
            try:
                os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
            except (OSError, ValueError):
                pass
        time.sleep(0.5)
