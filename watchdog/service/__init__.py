"""The daemon process: wiring of the stages, its own metrics, and the wall clock watched for jumps."""
