"""Fleet internals: upstream specs, instance state, session placement, pause gate, metrics.

The fleet itself (the `Backend` the gateway calls) is `envhub.gateway.router.Fleet`.
"""
