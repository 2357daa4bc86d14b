"""KV-cache transfer between workers: one interface (`transport.Transport`), several transports (host, cuda_ipc,
nccl), and the choice of one per prefill-decode pair (`choice`). Import the modules themselves: the tensor-free
ones (`choice`, `errors`, `handoff`) must stay loadable without torch, so this package imports nothing."""
