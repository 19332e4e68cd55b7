"""The wire contract every role shares: configs, HTTP bodies, the storage codec, frames.

Nothing here imports torch, gymnasium or a web framework: a role that only needs to read a
config or a request body pays for pydantic and numpy alone.
"""
