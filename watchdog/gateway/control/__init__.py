"""The daemon's side of the gateway: starts or adopts the gateway process, steers it, exports its metrics.

It imports the protocol (`..protocol`) and never the data plane (`..dataplane`) nor its HTTP stacks.
"""
