"""lwm_jax.data: trajectories and everything that turns them into training batches.

The trajectory schema and its JSONL files, importers and hygiene filters, the AgentWorldBench
record format, system prompts and chat rendering, the reply format (`reply`: tags, thinking
target, parsing a reply), loss masking, tokenizers, the TFDS builder and the Grain pipelines.
The bottom of the house: imports nothing else from lwm_jax.
"""
