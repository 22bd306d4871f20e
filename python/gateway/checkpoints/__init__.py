"""Checkpoint writing in the real on-disk layouts, in numpy only (no torch at runtime).

One implementation serves the runtime demo (`gateway.demo`) and the test/bench tools
(`tools/ckpt`):

* `numerics`  - exact float32 -> bf16 / fp8 e4m3 casts and the fp8 / fp4 block quantisers;
* `shards`    - a streaming, sharded safetensors writer (one tensor in memory at a time);
* `deepseek_v4` - the DeepSeek-V4 tensor inventory of a config, its random draws, encoding
  and config.json, and a writer of a whole checkpoint folder.
"""
