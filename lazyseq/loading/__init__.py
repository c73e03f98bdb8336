"""Background loading: workers (threads or processes) that compute items ahead of the reader."""
