"""Virtual-time simulation: engine, device and workload around the real TempoKV code."""
