"""``python -m bsrctl.stack.launch.cgroup_join PROCS_FILE... -- ARGV...``: write this process's PID
into each cgroup's ``cgroup.procs``, then exec ARGV (same PID), so the launched process and
every child it starts are in those cgroups from their first page on (cgroup v1 charges a
page to the cgroup that first touched it)."""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        print("usage: cgroup_join PROCS_FILE... -- ARGV...", file=sys.stderr)
        return 2
    at = argv.index("--")
    for procs in argv[:at]:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    cmd = argv[at + 1 :]
    os.execvp(cmd[0], cmd)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
