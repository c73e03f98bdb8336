"""Serving a pipeline to consumers in other processes or on other machines, over ZeroMQ."""
