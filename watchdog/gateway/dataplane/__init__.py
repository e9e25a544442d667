"""The gateway process (the data plane): admission, the streaming pass-through and the commands it takes.

It imports the protocol (`..protocol`) and never the daemon's side (`..control`).
"""
