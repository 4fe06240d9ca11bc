"""lwm_jax.data: trajectories in, token batches out. Imports nothing else of lwm_jax.

  schema       the Trajectory record; strict/skip loading with counted, quarantined bad lines
  jsonl        the one JSON-lines reader (plain or gzip) behind every loader
  importers    AgentWorldBench and OpenAI-chat files as trajectories
  bench_records  the AgentWorldBench record format (reader and writer)
  hygiene      the recipe's filters (declared tools, broken GUI, retry cycles, missing state)
  masking      the CPT turn classes and their deterministic keep decisions
  prompts      the twelve system-prompt variants and chat rendering (guidance, demos: long forms)
  reply        the reply format: tags, the thinking target, parsing a model's reply
  tokenizer    SentencePiece and Hugging Face tokenizers with ChatML and per-token loss weights
  lengths      fitting samples into seq_len (CPT windows, over-long SFT/RL policy)
  pipeline     Grain pipelines for cpt, sft and rl-prompts with exact resume
  documents    plain documents (knowledge text) for CPT with full loss, mixed in at a token share
  tfds_trajectories  the ArrayRecord dataset built by `launch/data.py build` (memory, stream or beam)
  corpus_build the build's corpus-wide steps as per-shard and per-key parts; the streaming build
  build_beam   the same build as an Apache Beam pipeline (the optional `.[beam]` extra)
"""
