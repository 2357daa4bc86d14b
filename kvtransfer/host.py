"""Host/TCP: the blocks travel as one host-memory frame after the `kv_handoff` record. CPU mode, and the fallback."""
from __future__ import annotations

import torch

from kvtransfer.errors import TransferError
from kvtransfer.segments import block_ids_tensor
from kvtransfer.transport import Sent, Transport


class HostTransport(Transport):
    """The blocks are gathered into one contiguous buffer, so a whole prompt is one copy and one frame however many
    blocks it has. It needs no descriptor: the router saw every worker's layout agree at hello."""

    name = "host"

    def send(self, request_id, peer_id, peer, src_block_ids, dst_block_ids):
        data = self.pool.read_blocks(block_ids_tensor(src_block_ids, self.pool.kv.device))
        if data.device.type != "cpu":
            data = data.to("cpu")
        # Reinterpret as bytes: numpy has no bfloat16, and zmq sends any buffer without copying.
        return Sent(payload=[memoryview(data.view(torch.uint8).numpy()).cast("B")])

    def receive(self, record, dst_block_ids, frames):
        if len(frames) != 1:
            raise TransferError(f"host transport expects 1 payload frame, got {len(frames)}")
        expected = len(dst_block_ids) * self.pool.layout.block_bytes
        if frames[0].nbytes != expected:
            raise TransferError(f"payload is {frames[0].nbytes} bytes, expected {expected} for {len(dst_block_ids)} "
                                f"blocks")
        data = torch.frombuffer(frames[0], dtype=self.pool.dtype).view(len(dst_block_ids), *self.pool.kv.shape[1:])
        self.pool.write_blocks(block_ids_tensor(dst_block_ids, self.pool.kv.device), data)
        return None
