from __future__ import annotations

import torch

from kvtransfer.descriptors import TransferError
from kvtransfer.transport import Sent, Transport, block_ids_tensor


class HostTransport(Transport):
    """Blocks travel as one host-memory frame over the data channel (TCP): CPU mode, and the fallback.

    The blocks are gathered into one contiguous buffer, so a whole prompt is one copy and one frame
    however many blocks it has.
    """

    name = "host"

    def send(self, request_id, peer_id, peer_descriptor, src_block_ids, dst_block_ids):
        data = self.pool.read_blocks(block_ids_tensor(src_block_ids, self.pool.kv.device))
        if data.device.type != "cpu":
            data = data.to("cpu")
        # Reinterpret as bytes: numpy has no bfloat16, and zmq sends any buffer without copying.
        return Sent([memoryview(data.view(torch.uint8).numpy()).cast("B")])

    def receive(self, request_id, peer_id, dst_block_ids, frames):
        if len(frames) != 1:
            raise TransferError(f"host transport expects 1 payload frame, got {len(frames)}")
        layout = self.pool.layout
        expected = len(dst_block_ids) * layout.block_bytes
        if frames[0].nbytes != expected:
            raise TransferError(f"payload is {frames[0].nbytes} bytes, expected {expected} for {len(dst_block_ids)} blocks")
        data = torch.frombuffer(frames[0], dtype=layout.dtype).view(len(dst_block_ids), *self.pool.kv.shape[1:])
        self.pool.write_blocks(block_ids_tensor(dst_block_ids, self.pool.kv.device), data)
        return None
