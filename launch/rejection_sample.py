"""SFT data with reasoning traces by rejection sampling from a teacher.

  # a served model (e.g. Qwen behind vLLM or our own launch/serve.py), judge-free reward
  python launch/rejection_sample.py --input=data/corpus/terminal_train.jsonl.gz \
      --output=/tmp/sft_rs.jsonl --teacher_endpoint=http://localhost:8000/v1 \
      --teacher_model=Qwen/Qwen3-30B-A3B --n=3 --reward=rule=0.1,reference=0.9 --threshold=15
  # a local checkpoint as teacher, the paper's reward mix with a judge endpoint
  python launch/rejection_sample.py --input=... --output=... --teacher_checkpoint=WORKDIR \
      --reward=rubric=0.9,rule=0.1 --judge_endpoint=http://judge:8000/v1 --judge_model=NAME

For each trajectory (optionally only those in the SFT share of a CPT/SFT/RL split, `--pool`), the
teacher answers the SFT prompt of its target turn `--n` times in thinking mode; the best answer
whose reward reaches `--threshold` (rewards are on the 0-25 scale) is kept. The output is
trajectory JSONL read by the SFT stage (run it with the same --seed): the teacher's reasoning
sits in `meta.think`, the kept answer's reward in `meta.rejection`. Retention per domain is
printed and saved next to the output (`OUTPUT.stats.json`).
"""
import json
import os
import sys

from absl import app, flags


flags.DEFINE_string("input", None, "comma-separated trajectory files (JSONL / JSONL.gz; any format "
                    "the data CLI reads)")
flags.DEFINE_string("output", None, "SFT trajectory JSONL to write")
flags.DEFINE_string("stats", "", "retention statistics JSON (default: OUTPUT.stats.json)")
flags.DEFINE_string("teacher_endpoint", "", "OpenAI-compatible endpoint of the teacher")
flags.DEFINE_string("teacher_model", "", "model name at --teacher_endpoint")
flags.DEFINE_string("teacher_checkpoint", "", "or: a workdir, step folder or HF folder to sample")
flags.DEFINE_string("api_key_env", "OPENAI_API_KEY", "environment variable holding the API key")
flags.DEFINE_integer("n", 3, "answers per prompt")
flags.DEFINE_float("threshold", 15.0, "least reward (0-25) of a kept answer")
flags.DEFINE_string("reward", "rule=0.1,reference=0.9", "reward mix NAME=WEIGHT,... (rule, "
                    "reference, rubric; rubric needs a judge)")
flags.DEFINE_string("judge_endpoint", "", "OpenAI-compatible endpoint of the judge (rubric)")
flags.DEFINE_string("judge_model", "", "model name at --judge_endpoint")
flags.DEFINE_string("judge_checkpoint", "", "or: a local judge checkpoint")
flags.DEFINE_string("judge_style", "rubric", "rubric | official")
flags.DEFINE_string("judge_prompts", "", "official judge prompts folder (--judge_style=official)")
flags.DEFINE_enum("target", "reference", ["reference", "teacher"], "the target's observation: "
                  "the real one or the teacher's prediction")
flags.DEFINE_string("pool", "", "keep only this pool of the split (cpt, sft or rl); '' = all")
flags.DEFINE_string("fractions", "cpt=0.6,sft=0.3,rl=0.1", "pool fractions for --pool")
flags.DEFINE_integer("seed", 0, "target turns and prompt variants (use the SFT stage's seed)")
flags.DEFINE_float("temperature", 0.6, "teacher sampling temperature (> 0)")
flags.DEFINE_integer("max_tokens", 4096, "teacher tokens per answer")
flags.DEFINE_integer("concurrency", 8, "parallel requests to each endpoint")
flags.DEFINE_integer("limit", 0, "use only the first N trajectories (0 = all)")
flags.DEFINE_bool("hygiene", True, "apply the data pipeline's hygiene filters to the input")
flags.DEFINE_enum("validation", "strict", ["strict", "skip"], "bad input lines: fail or count")
flags.mark_flags_as_required(["input", "output"])


def _fractions(spec: str) -> dict:
  out = {}
  for part in spec.split(","):
    k, _, v = part.partition("=")
    out[k.strip()] = float(v)
  return out


def _backend(endpoint: str, model: str, checkpoint: str, what: str, temperature, max_tokens):
  from lwm_jax.sampling.backends import OpenAIBackend, SamplerBackend
  f = flags.FLAGS
  if checkpoint:
    return SamplerBackend.from_checkpoint(checkpoint, temperature=temperature or 0.0,
                                          max_new_tokens=max_tokens)
  if endpoint:
    if not model:
      raise ValueError(f"--{what}_model: the model name at --{what}_endpoint is needed")
    return OpenAIBackend(endpoint, model, temperature=temperature, max_tokens=max_tokens,
                         concurrency=f.concurrency, api_key=os.environ.get(f.api_key_env))
  return None


def main(argv):
  del argv
  from lwm_jax import judge as judge_lib
  from lwm_jax.data import hygiene, importers, schema
  from lwm_jax.rl import pool as pool_lib
  from lwm_jax.rl import rejection, rewards
  f = flags.FLAGS
  try:
    if f.temperature <= 0:
      raise ValueError("--temperature must be > 0: the n answers must differ")
    trajs, bad = [], 0
    for path in [p.strip() for p in f.input.split(",") if p.strip()]:
      t, report = importers.load_any(path, mode=f.validation)
      trajs += t
      bad += report.num_bad
      if report.num_bad:
        print(report.summary(), file=sys.stderr)
    if f.hygiene:
      n_in = len(trajs)
      trajs = hygiene.filter_trajectories(trajs)
      if len(trajs) < n_in:
        print(f"hygiene: dropped {n_in - len(trajs)} of {n_in} trajectories", file=sys.stderr)
    if f.pool:
      trajs = pool_lib.split_pools(trajs, _fractions(f.fractions), f.seed)[f.pool]
    if f.limit:
      trajs = trajs[:f.limit]
    teacher = _backend(f.teacher_endpoint, f.teacher_model, f.teacher_checkpoint, "teacher",
                       f.temperature, f.max_tokens)
    if teacher is None:
      raise ValueError("give --teacher_endpoint (with --teacher_model) or --teacher_checkpoint")
    weights = rewards.parse_weights(f.reward)
    options = {}
    if weights.get("rubric"):
      judge = _backend(f.judge_endpoint, f.judge_model, f.judge_checkpoint, "judge", 0.0, 4096)
      if judge is None:
        raise ValueError("--reward has rubric: give --judge_endpoint or --judge_checkpoint")
      options = {"backend": judge, "style": judge_lib.make_style(f.judge_style,
                                                                 f.judge_prompts or None)}
    reward = rewards.make_reward(weights, **options)
  except (ValueError, FileNotFoundError, KeyError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  kept, stats = rejection.rejection_sample(
      trajs, teacher, reward, n=f.n, threshold=f.threshold, seed=f.seed, target=f.target,
      temperature=f.temperature, max_new_tokens=f.max_tokens)
  stats.update(input=f.input, output=f.output, reward=weights, teacher=getattr(
      teacher, "name", "teacher"), bad_input_lines=bad, seed=f.seed, target=f.target)
  schema.write_jsonl(f.output, kept)
  stats_path = f.stats or f.output + ".stats.json"
  with open(stats_path, "w") as fh:
    json.dump(stats, fh, indent=2)
  print(rejection.format_stats(stats))
  print(f"wrote {len(kept)} trajectories to {f.output}; statistics in {stats_path}")


if __name__ == "__main__":
  app.run(main)
