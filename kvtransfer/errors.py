"""The one error a KV transfer raises: it could not start, or did not complete (the request fails, `aborted`)."""


class TransferError(RuntimeError):
    pass
