"""`topo-reporter extender`: a kube-scheduler extender that filters and ranks nodes by free GPUs.

It reads what the agents publish (the availability annotation, `reporter.availability`) and
answers kube-scheduler's filter and prioritize calls: `protocol` (pure, request to answer),
`cache` (the watch-backed Node cache for `nodeCacheCapable`), `server` (HTTP, health, metrics).
It never writes to the API and never searches GPU sets: the agents did that on their nodes.
"""
