"""A one-node Slurm cluster for the tests: Debian's ``slurm-wlm`` and ``munge`` started on this
machine (``munged`` on a private socket and key, ``slurmctld`` and ``slurmd`` on free loopback
ports, every file under one temporary directory), real ``sbatch`` / ``scontrol`` against it.

``SlurmCluster.start(dir)`` returns a running cluster or raises :class:`Unavailable` (the binaries
are missing); ``stop()`` cancels the jobs and ends the daemons. ``env`` holds ``SLURM_CONF``.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "srun")
SBIN = ("/usr/sbin", "/usr/bin", "/sbin")


class Unavailable(RuntimeError):
    """Slurm or munge is not installed here."""


def _which(name: str) -> str | None:
    return shutil.which(name) or next((f"{d}/{name}" for d in SBIN if os.access(f"{d}/{name}", os.X_OK)), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.node = socket.gethostname().split(".")[0]
        self.env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
        self.bin = {b: _which(b) for b in BINARIES}

    @classmethod
    def start(cls, root: Path) -> "SlurmCluster":
        c = cls(Path(root))
        missing = [b for b, p in c.bin.items() if p is None]
        if missing:
            raise Unavailable(f"not installed: {', '.join(missing)} (Debian: apt-get install slurm-wlm munge)")
        c._start()
        return c

    def _start(self) -> None:
        r = self.root
        for d in ("munge", "state", "spool", "log"):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o700)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        sock = r / "munge" / "munge.sock"
        subprocess.run([self.bin["munged"], "--force", f"--socket={sock}", f"--key-file={key}", f"--pid-file={r / 'munge/munged.pid'}",
                        f"--log-file={r / 'munge/munged.log'}", f"--seed-file={r / 'munge/munged.seed'}"], check=True, capture_output=True)
        user = getpass.getuser()
        (r / "slurm.conf").write_text("\n".join([
            "ClusterName=reasonrl-test",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            f"SlurmUser={user}",
            f"SlurmdUser={user}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={sock}",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log/slurmctld.log'}",
            f"SlurmdLogFile={r / 'log/slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "MpiDefault=none",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "ReturnToService=2",
            "KillWait=10",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]) + "\n")
        conf = str(r / "slurm.conf")
        subprocess.run([self.bin["slurmctld"], "-f", conf], env=self.env, check=True, capture_output=True)
        subprocess.run([self.bin["slurmd"], "-f", conf, "-N", self.node], env=self.env, check=True, capture_output=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            p = subprocess.run([self.bin["scontrol"], "show", "node", self.node], env=self.env, capture_output=True, text=True)
            if p.returncode == 0 and "State=IDLE" in p.stdout:
                return
            time.sleep(0.5)
        raise RuntimeError(f"the test cluster's node never became idle: {self.logs()}")

    def sbatch(self, *args: str, cwd: Path, env: dict | None = None) -> str:
        p = subprocess.run([self.bin["sbatch"], "--parsable", *args], cwd=cwd, env={**self.env, **(env or {})}, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        return p.stdout.strip().split(";")[0]

    def state(self, job: str) -> str:
        """The job's state (of every task of an array: the first one not COMPLETED, else COMPLETED)."""
        p = subprocess.run([self.bin["scontrol"], "show", "job", job, "--oneliner"], env=self.env, capture_output=True, text=True)
        states = [w.split("=", 1)[1] for ln in p.stdout.splitlines() for w in ln.split() if w.startswith("JobState=")]
        return next((s for s in states if s != "COMPLETED"), "COMPLETED") if states else "UNKNOWN"

    def wait(self, job: str, timeout_s: float) -> str:
        """Wait for the job (and every task of an array) to end; its final state."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            s = self.state(job)
            if s not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED"):
                return s
            time.sleep(1)
        return "TIMEOUT (the test's)"

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:]) for p in sorted((self.root / "log").glob("*.log")))

    def stop(self) -> None:
        scancel = _which("scancel")
        if scancel:
            subprocess.run([scancel, "--user", getpass.getuser()], env=self.env, capture_output=True)
            time.sleep(1)
        subprocess.run([self.bin["scontrol"], "shutdown"], env=self.env, capture_output=True)
        for pidfile in ("slurmd.pid", "slurmctld.pid", "munge/munged.pid"):
            try:
                pid = int((self.root / pidfile).read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            for _ in range(50):
                try:
                    os.kill(pid, signal.SIGTERM if _ < 40 else signal.SIGKILL)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
