#!/usr/bin/env bash
# train_local as a data-parallel job (docs/scale_out.md): 2 ranks under mpirun with accumulation 2
# write the same checkpoint, bit for bit (model and optimizer state), as one process with
# accumulation 2; rank 0 alone writes checkpoints, and a 2-rank job resumed from one of them (and
# one process resumed from it) ends at the same bits again. A tied model, and gradients on NVMe,
# too.
set -euo pipefail
source "$(dirname "$0")/dist_test_lib.sh"
launch="$1"
train="$2"
config="$3"
tied_config="$4"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
run=(--steps=4 --micro_batch=1 --seq_len=32 --accumulation=2 --eval_every=0 --warmup=1 --threads=1
  --optimizer_threads=1 --arena_mb=64)
common=(--config="${config}" "${run[@]}")
"${train}" "${common[@]}" --checkpoint_dir="${dir}/alone" 2>"${dir}/alone.log"
timeout 300 "${launch}" 2 "${train}" "${common[@]}" --data_parallel --checkpoint_dir="${dir}/dp" \
  --checkpoint_every=2 2>"${dir}/dp.log"
cat "${dir}/dp.log"
grep -q "step 4/4 .* comm [0-9.]* s [0-9]* B" "${dir}/dp.log" ||
  { echo "FAIL: no per-step communication figures"; exit 1; }
[[ "$(grep -c "^step 4/4" "${dir}/dp.log")" == 1 ]] || { echo "FAIL: more than rank 0 printed"; exit 1; }
[[ "$(ls "${dir}/dp")" == "$(printf 'step-000000000002\nstep-000000000004')" ]] ||
  { echo "FAIL: checkpoints: $(ls "${dir}/dp")"; exit 1; }
same_state "${dir}/alone/step-000000000004" "${dir}/dp/step-000000000004" "2 ranks vs accumulation 2"

# A tied model: each rank keeps the embedding rows' gradient apart from the LM head's and the
# reduction adds them in one process's order, so 2 ranks write accumulation 2's checkpoint bit for
# bit. Under memory budgets (everything fits in pinned RAM) the placement counts that array with
# the gradients: a rank's pinned use is one process's plus the 256 x 64 fp32 embedding (65536 B).
tied=(--config="${tied_config}" "${run[@]}" --pinned_ram_mb=1000 --ram_mb=1000)
"${train}" "${tied[@]}" --checkpoint_dir="${dir}/tied_alone" 2>"${dir}/tied_alone.log"
timeout 300 "${launch}" 2 "${train}" "${tied[@]}" --data_parallel \
  --checkpoint_dir="${dir}/tied_dp" 2>"${dir}/tied_dp.log" ||
  { cat "${dir}/tied_dp.log"; echo "FAIL: 2 ranks of a tied model"; exit 1; }
same_state "${dir}/tied_alone/step-000000000004" "${dir}/tied_dp/step-000000000004" \
  "tied: 2 ranks vs accumulation 2"
pinned_use() {  # pinned_use LOG: the pinned bytes of the first placement table's budget line
  grep -m1 -o "budget use: pinned [0-9]*" "$1" | grep -o "[0-9]*$" ||
    { cat "$1"; echo "FAIL: no placement table in $1"; exit 1; }
}
alone_pinned="$(pinned_use "${dir}/tied_alone.log")"
dp_pinned="$(pinned_use "${dir}/tied_dp.log")"
[[ $((dp_pinned - alone_pinned)) == 65536 ]] ||
  { echo "FAIL: tied: a rank's pinned use ${dp_pinned}, one process's ${alone_pinned}"; exit 1; }
echo "tied: a rank's memory plan counts the rows' gradient apart (+65536 B pinned)"

mkdir -p "${dir}/resumed_dp" "${dir}/resumed_alone"
cp -r "${dir}/dp/step-000000000002" "${dir}/resumed_dp/"
cp -r "${dir}/dp/step-000000000002" "${dir}/resumed_alone/"
timeout 300 "${launch}" 2 "${train}" "${common[@]}" --data_parallel --resume \
  --checkpoint_dir="${dir}/resumed_dp" 2>"${dir}/resumed_dp.log"
grep -q "resumed from .*step-000000000002 at step 2" "${dir}/resumed_dp.log" ||
  { cat "${dir}/resumed_dp.log"; echo "FAIL: the 2-rank job did not resume"; exit 1; }
same_state "${dir}/alone/step-000000000004" "${dir}/resumed_dp/step-000000000004" \
  "2 ranks resumed at step 2"
"${train}" "${common[@]}" --resume --checkpoint_dir="${dir}/resumed_alone" 2>"${dir}/resumed_alone.log"
same_state "${dir}/alone/step-000000000004" "${dir}/resumed_alone/step-000000000004" \
  "one process resumed from the 2-rank job's step 2"

# An accumulation the ranks cannot split evenly is refused, naming both numbers.
expect_refused "accumulation 3 over 2 ranks" "${dir}/odd.log" \
  "grad_accumulation=3 must be a positive multiple of the data-parallel world size 2" \
  timeout 300 "${launch}" 2 "${train}" "${common[@]}" --accumulation=3 --data_parallel
# Ranks started with different flags are refused before the first step, naming the rank (they
# would otherwise run different numbers of collectives and wait for each other forever).
cat >"${dir}/per_rank.sh" <<EOS
#!/usr/bin/env bash
steps=4
[[ "\${OMPI_COMM_WORLD_RANK}" == 1 ]] && steps=5
exec "${train}" ${common[*]} --steps="\${steps}"
EOS
chmod +x "${dir}/per_rank.sh"
expect_refused "ranks with different --steps" "${dir}/mismatch.log" \
  "rank 1 runs a different job from rank 0" timeout 300 "${launch}" 2 "${dir}/per_rank.sh"

# Gradients on NVMe: each rank reduces its gradient file chunk by chunk (the built-in ~10M model,
# whose layers span several 1 MiB chunks), in a directory of its own under --nvme_dir, and ends at
# the bits of one process with every gradient in RAM. A rank that places its gradients otherwise
# would reduce them in other pieces: refused before the first step, naming it.
builtin=(--steps=2 --micro_batch=1 --seq_len=32 --accumulation=2 --eval_every=0 --warmup=1
  --threads=1 --optimizer_threads=1 --arena_mb=256)
nvme=(--nvme_mb=1000 --pinned_ram_mb=1000 --ram_mb=1000 --grad_on_nvme --nvme_chunk_mb=1)
"${train}" "${builtin[@]}" --checkpoint_dir="${dir}/builtin_alone" 2>"${dir}/builtin_alone.log"
mkdir -p "${dir}/nvme"
timeout 300 "${launch}" 2 "${train}" "${builtin[@]}" "${nvme[@]}" --nvme_dir="${dir}/nvme" \
  --checkpoint_dir="${dir}/nvme_dp" 2>"${dir}/nvme_dp.log" ||
  { cat "${dir}/nvme_dp.log"; echo "FAIL: 2 ranks with gradients on NVMe"; exit 1; }
grep -q "^grad .*nvme" "${dir}/nvme_dp.log" ||
  { cat "${dir}/nvme_dp.log"; echo "FAIL: the gradients were not placed on NVMe"; exit 1; }
for r in 0 1; do
  [[ -f "${dir}/nvme/rank-${r}/gradients.bin" ]] || { echo "FAIL: no rank-${r}/gradients.bin"; exit 1; }
done
same_state "${dir}/builtin_alone/step-000000000002" "${dir}/nvme_dp/step-000000000002" \
  "2 ranks with gradients on NVMe vs accumulation 2 in RAM"
cat >"${dir}/nvme_rank1.sh" <<EOS
#!/usr/bin/env bash
extra=()
[[ "\${OMPI_COMM_WORLD_RANK}" == 1 ]] && extra=(${nvme[*]} --nvme_dir="${dir}/nvme")
exec "${train}" ${builtin[*]} "\${extra[@]}"
EOS
chmod +x "${dir}/nvme_rank1.sh"
expect_refused "ranks with gradients in RAM and on NVMe" "${dir}/nvme_mismatch.log" \
  "rank 1 runs a different job from rank 0" timeout 300 "${launch}" 2 "${dir}/nvme_rank1.sh"
echo PASS
