"""Go's and Prometheus' text formats, one module each for every stage: RFC 3339 times, Go's strconv, string
maps."""
