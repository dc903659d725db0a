#!/usr/bin/env bash
# ZeRO-1 is exact (docs/scale_out.md): W ranks under mpirun on loopback, each owning a range of
# every parameter-store entry's optimizer state and running micro-batch slot r, give bitwise the
# losses, gradient norms and final weights of one process with accumulation W — for W = 2 and 3,
# untied and tied embeddings — on every rank.
set -euo pipefail
source "$(dirname "$0")/dist_test_lib.sh"
launch="$1"
worker="$2"
same_optimizer="$3"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
steps=4
ranks_equal_accumulation "${launch}" "${worker}" "${dir}" "${steps}" zero1 "ZeRO-1 "
# shards_cover STEM WORLD NEED_SPLIT: the ranks' ranges (each rank's PREFIX.shard, one line per
# entry: entry, first, count, elements) hold every element of every entry exactly once, and with
# NEED_SPLIT some entry is split among ranks (not only whole entries).
shards_cover() {
  cat "${dir}/$1$2".rank*.shard | awk -v world="$2" -v need_split="$3" -v label="$1" '
    $3 > 0 { held[$1] += $3; ranks[$1] += 1 }
    { size[$1] = $4; if ($2 != expected[$1] + 0 && $3 > 0) { print "FAIL: " label world ": entry " $1 " range at " $2 ", expected " expected[$1] + 0; bad = 1 } if ($3 > 0) expected[$1] = $2 + $3 }
    END {
      if (bad) exit 1
      for (e in size) if (held[e] != size[e]) { print "FAIL: " label world ": entry " e " held " held[e] + 0 " of " size[e]; exit 1 }
      n = 0; for (e in ranks) if (ranks[e] > 1) ++n
      if (need_split && n == 0) { print "FAIL: " label world ": no entry is split among ranks"; exit 1 }
      print "ZeRO-1 " label world ": " n " entries split among ranks, every element held once"
    }'
}
for world in 2 3; do shards_cover w "${world}" $((world == 3)); done
# A ZeRO-1 rank holds a shard of m and v: writing a one-process checkpoint is refused, naming
# why, before anything is written (the ranks write sharded checkpoints together, below).
for ((r = 0; r < 3; ++r)); do
  grep -q "FAILED_PRECONDITION: checkpoint: entry .*another rank's ZeRO-1 shard" \
    "${dir}/w3.rank${r}.ckpt" || { echo "FAIL: rank ${r}: $(cat "${dir}/w3.rank${r}.ckpt")"; exit 1; }
  if compgen -G "${dir}/w3.rank${r}.refused_checkpoint/step-*" >/dev/null; then
    echo "FAIL: rank ${r} wrote a checkpoint"; exit 1
  fi
done
echo "ZeRO-1 ranks refuse to write a checkpoint"
# Resume on another world size: a checkpoint of one process (accumulation W) after step 2 loads on
# W ZeRO-1 ranks, each restoring its own ranges' m and v, and steps 3-4 give bitwise the losses
# and final weights of the uninterrupted run.
for world in 2 3; do
  ckpt="${dir}/ckpt${world}"
  DP_SAVE_DIR="${ckpt}" DP_SAVE_AT=2 "${worker}" "${dir}/save${world}" "${world}" "${steps}" 0
  cmp "${dir}/save${world}.accum.losses" "${dir}/w${world}.accum.losses" ||
    { echo "FAIL: writing a checkpoint changed the run"; exit 1; }
  step_dir="$(ls -d "${ckpt}"/step-*)"
  prefix="${dir}/resume${world}"
  DP_RESUME_FROM="${step_dir}" timeout 300 "${launch}" "${world}" "${worker}" "${prefix}" \
    "${world}" "${steps}" zero1
  tail -n 2 "${dir}/w${world}.accum.losses" >"${dir}/w${world}.accum.last2"
  for ((r = 0; r < world; ++r)); do
    cmp "${dir}/w${world}.accum.last2" "${prefix}.rank${r}.losses" ||
      { echo "FAIL: resumed ZeRO-1 W=${world} rank ${r}: losses of steps 3-4 differ"; exit 1; }
    cmp "${dir}/w${world}.accum.weights" "${prefix}.rank${r}.weights" ||
      { echo "FAIL: resumed ZeRO-1 W=${world} rank ${r}: final weights differ"; exit 1; }
  done
  echo "one-process checkpoint resumed on ${world} ZeRO-1 ranks: steps 3-4 bit for bit"
done
# Sharded checkpoints: W ZeRO-1 ranks write one shard each and rank 0 the model and one manifest
# listing them; it resumes in one process with accumulation W (2 -> 1, 3 -> 1) bitwise as the
# uninterrupted run, and a 2-shard checkpoint resumes on 3 ZeRO-1 ranks bitwise as one process
# with accumulation 3 resuming it (2 -> 3).
for world in 2 3; do
  ckpt="${dir}/zckpt${world}"
  DP_SAVE_DIR="${ckpt}" DP_SAVE_AT=2 timeout 300 "${launch}" "${world}" "${worker}" \
    "${dir}/zsave${world}" "${world}" "${steps}" zero1
  cmp "${dir}/zsave${world}.rank0.losses" "${dir}/w${world}.accum.losses" ||
    { echo "FAIL: writing a sharded checkpoint changed the run"; exit 1; }
  step_dir="$(ls -d "${ckpt}"/step-*)"
  for ((r = 0; r < world; ++r)); do
    shard="$(printf 'optimizer-rank-%05d-of-%05d.safetensors' "${r}" "${world}")"
    [[ -f "${step_dir}/${shard}" ]] || { echo "FAIL: ${step_dir} has no ${shard}"; exit 1; }
    grep -q "\"${shard}\"" "${step_dir}/manifest.json" ||
      { echo "FAIL: manifest.json does not list ${shard}"; exit 1; }
  done
  if [[ -e "${step_dir}/optimizer.safetensors" ]] || compgen -G "${step_dir}/.shard-*" >/dev/null; then
    echo "FAIL: ${step_dir} has an unsharded optimizer file or a shard sidecar left"; exit 1
  fi
  # At W=3 the split entry's tensor is written in pieces, "m.<name>[begin:end]", by two shards.
  if ((world == 3)); then
    [[ "$(grep -la '"m\.[A-Za-z0-9_.]*\[[0-9]*:[0-9]*\]"' "${step_dir}"/optimizer-rank-* | wc -l)" -ge 2 ]] ||
      { echo "FAIL: no tensor of ${step_dir} is in pieces in two shards"; exit 1; }
  fi
  DP_RESUME_FROM="${step_dir}" "${worker}" "${dir}/zres${world}" "${world}" "${steps}" 0
  cmp "${dir}/w${world}.accum.last2" "${dir}/zres${world}.accum.losses" ||
    { echo "FAIL: ${world} shards -> 1 process: losses of steps 3-4 differ"; exit 1; }
  cmp "${dir}/w${world}.accum.weights" "${dir}/zres${world}.accum.weights" ||
    { echo "FAIL: ${world} shards -> 1 process: final weights differ"; exit 1; }
  echo "sharded checkpoint of ${world} ZeRO-1 ranks resumed in one process: bit for bit"
done
# The pieces put back together are one process's optimizer state (same_optimizer_state.py).
same_state "$(ls -d "${dir}/ckpt3"/step-*)" "$(ls -d "${dir}/zckpt3"/step-*)" \
  "3 ZeRO-1 shards (a tensor in pieces) vs one process" "${same_optimizer}"
step_dir="$(ls -d "${dir}/zckpt2"/step-*)"
# A sharded checkpoint missing a shard is refused, naming the file.
cp -r "${step_dir}" "${dir}/broken"
rm "${dir}/broken/optimizer-rank-00001-of-00002.safetensors"
expect_refused "a checkpoint missing a shard" "${dir}/broken.err" \
  "optimizer-rank-00001-of-00002\.safetensors" \
  env DP_RESUME_FROM="${dir}/broken" "${worker}" "${dir}/broken_run" 2 "${steps}" 0
echo "a sharded checkpoint missing a shard is refused: $(cat "${dir}/broken.err")"
DP_RESUME_FROM="${step_dir}" "${worker}" "${dir}/z2to3" 3 "${steps}" 0
DP_RESUME_FROM="${step_dir}" timeout 300 "${launch}" 3 "${worker}" "${dir}/z2to3" 3 "${steps}" zero1
for ((r = 0; r < 3; ++r)); do
  same_run "${dir}/z2to3.accum" "${dir}/z2to3.rank${r}" "2 shards -> 3 ZeRO-1 ranks: rank ${r}"
done
echo "sharded checkpoint of 2 ZeRO-1 ranks resumed on 3: bit for bit as one process"
# Tied embeddings: each shard owner adds both arrays of every rank (the LM head's gradient, then
# the rows' scatter kept apart) in rank order, so ZeRO-1 is accumulation's bits there too.
ranks_equal_accumulation "${launch}" "${worker}" "${dir}" "${steps}" tiedzero1 "tied ZeRO-1 " tiedz
# Tied, the embedding (also the LM head) is split at W = 2 and 3: its slab and the rows' gradient
# kept apart are reduced to two owners in pieces.
for world in 2 3; do shards_cover tiedz "${world}" 1; done
# The check is not vacuous: the weights moved from one step to the next, so a rank that missed an
# owner's broadcast would differ (accumulation 1 and 2 differ too).
accumulation_changes_weights "${worker}" "${dir}" "${steps}"
echo PASS
