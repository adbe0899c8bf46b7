# Sourced by the training scripts (the original's launch scripts, one `deepspeed` call each).
# Runs from the repository root; HOSTFILE=hostfile adds `--hostfile hostfile` to the launcher;
# JOB_NAME overrides a script's job name, TRANSFORMER_KERNEL=0 drops --deepspeed_transformer_kernel.
#
# Unlike the original, every script passes --auto_resume: run again after a preemption or a
# crash, it continues from its job's latest checkpoint (OUT/saved_models/JOB/latest) instead of
# starting over. A phase-2 script resumed this way continues phase 2 (its checkpoints record
# the sequence length they were trained at), it does not re-warm again.
# The recipe as shipped (fp16, FusedLamb, DeepSpeed's transformer kernel) needs CUDA: said first,
# before any data or vocab error. REQUIRE_CUDA=0 skips the check (the tests, with a stand-in launcher).
source "$(dirname "${BASH_SOURCE[0]}")/require_cuda.sh"
if [ "${REQUIRE_CUDA:-1}" != 0 ]; then
  require_cuda "$(basename "$0") runs the original's GPU recipe (fp16, FusedLamb, DeepSpeed's transformer kernel) and needs a CUDA GPU; none here (torch.cuda.is_available() is False). On a CPU: bash scripts/demo.sh"
fi
# DATA and OUT (set by the script) are made absolute, since the launch runs from the repository root.
DATA=$(cd "$DATA" && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "${BASH_SOURCE[0]}")/.."
launcher=(bash scripts/run_launcher.sh deepspeed)   # Ctrl-C without the runner's traceback (run_launcher.sh says why)
if [ -n "${HOSTFILE:-}" ]; then launcher+=(--hostfile "$HOSTFILE"); fi
# LAUNCHER_ARGS: more launcher flags, e.g. "--launcher openmpi" for the MPI variants of the 1-bit scripts
if [ -n "${LAUNCHER_ARGS:-}" ]; then read -r -a extra_launcher_args <<< "$LAUNCHER_ARGS"; launcher+=("${extra_launcher_args[@]}"); fi
# The original's scripts use DeepSpeed's fused transformer kernel (CUDA only);
# TRANSFORMER_KERNEL=0 runs the same recipe on this project's own layers.
kernel=(--deepspeed_transformer_kernel)
if [ "${TRANSFORMER_KERNEL:-1}" = 0 ]; then kernel=(); fi

# phase1_checkpoint OUT PHASE1_JOB EPOCH PHASE2_JOB: sets `load` to the flags that start phase 2
# from OUT/saved_models/PHASE1_JOB/epoch{EPOCH}_step*, as the original's phase-2 scripts did.
# Without that checkpoint it is fine only when phase 2 has checkpoints of its own to resume.
phase1_checkpoint() {
  local folder="$1/saved_models/$2" tag=""
  for dir in "$folder"/epoch"$3"_step*; do
    if [ -d "$dir" ]; then tag=$(basename "$dir"); fi
  done
  load=()
  if [ -n "$tag" ]; then
    echo "phase 1 checkpoint: $folder/$tag"
    load=(--load_training_checkpoint "$folder" --load_checkpoint_id "$tag")
  elif [ ! -f "$1/saved_models/$4/latest" ]; then
    echo "error: no epoch$3_step* checkpoint in $folder (phase 1's; set LOAD_EPOCH or PHASE1_JOB)" >&2
    exit 2
  fi
}
