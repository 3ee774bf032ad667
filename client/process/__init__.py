"""The long-lived site process, its channel, the ClientApp's forwarder, its supervisor and fault injection."""
