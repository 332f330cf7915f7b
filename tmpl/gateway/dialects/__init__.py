"""The API dialects the gateway speaks: each turns its requests into canonical messages and its replies back."""
