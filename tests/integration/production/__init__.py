"""Production mode: gate and tablet processes, failover, the topo."""
