"""Client library: tracer, agent contract and rollout driver."""
