"""A fleet of nodes qualified with one spec: Kubernetes manifests (``manifests``) from a nodes
file (``nodes``), the nightly's runner matrix, the local stand-in for a cluster (``local``)
and the report across nodes (``report``). bsrctl orchestrates nothing here: Kubernetes (or
the CI's runners, or N local processes) fans out, each node runs the usual command."""
