"""What the daemon and the gateway process share: the spec, the control channel, its codec and trust, the link
the daemon speaks through, and the snapshots the gateway hands back."""
