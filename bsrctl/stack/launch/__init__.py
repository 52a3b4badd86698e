"""A deployment bsrctl starts: every process by PID with a bounded health wait, stopped by
PID (``deployment``: ``LaunchedDeployment``; ``serving``: the processes and their command
lines; ``process``, ``netns``, ``twohost``, ``fast_tier``, ``cgroup_join``), what it loads
and serves (``extensions``, ``profile``, ``model``, ``tinymodel``), and the stack commands
(``standalone``: up/down, ``status``, ``plan``)."""
