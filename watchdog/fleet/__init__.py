"""The fleet: a group of watchdogs sharing one disruption budget, a lease-backed semaphore in etcd."""
