#!/usr/bin/env bash
# train_local on several CPU devices of one process (docs/scale_out.md "Several devices in one
# process"): --devices=2 and --devices=3 write the same checkpoint, bit for bit (model, optimizer
# and trainer state), as one device with the same accumulation, also with a tied embedding and
# with two micro-batches per device, with the gradients on NVMe, and reduce-scattering on the
# devices (--gradient_reduction=devices); the progress lines give each
# device's stall; an accumulation the devices cannot split evenly and the compute copy on NVMe are
# refused naming the flag or field.
set -euo pipefail
source "$(dirname "$0")/dist_test_lib.sh"
train="$1"
config="$2"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
common=(--config="${config}" --steps=3 --micro_batch=1 --seq_len=32 --eval_every=0 --warmup=1
  --threads=1 --optimizer_threads=1 --arena_mb=64)

"${train}" "${common[@]}" --accumulation=2 --checkpoint_dir="${dir}/one_a2" 2>"${dir}/one_a2.log"
"${train}" "${common[@]}" --accumulation=2 --devices=2 --checkpoint_dir="${dir}/two_a2" \
  2>"${dir}/two_a2.log"
cat "${dir}/two_a2.log"
grep -q "^step 3/3 .* stall [0-9.]*/[0-9.]* s" "${dir}/two_a2.log" ||
  { echo "FAIL: no per-device stall on the progress line"; exit 1; }
same_state "$(step "${dir}/one_a2" 3)" "$(step "${dir}/two_a2" 3)" "2 devices vs accumulation 2"

"${train}" "${common[@]}" --accumulation=6 --checkpoint_dir="${dir}/one_a6" 2>"${dir}/one_a6.log"
"${train}" "${common[@]}" --accumulation=6 --devices=3 --checkpoint_dir="${dir}/three_a6" \
  2>"${dir}/three_a6.log"
same_state "$(step "${dir}/one_a6" 3)" "$(step "${dir}/three_a6" 3)" \
  "3 devices, 2 micro-batches each, vs accumulation 6"

# --gradient_reduction=devices (each device sums its micro-batch, a rank-ordered reduce-scatter
# among the devices adds the sums, each device copies out 1/N) and device_shards (every
# micro-batch reduce-scattered, each device keeping its half of the sums): with one micro-batch
# per device, the same checkpoint again, and the run says how it reduced.
for mode in devices device_shards; do
  "${train}" "${common[@]}" --accumulation=2 --devices=2 --gradient_reduction="${mode}" \
    --checkpoint_dir="${dir}/two_a2_${mode}" 2>"${dir}/two_a2_${mode}.log" ||
    { cat "${dir}/two_a2_${mode}.log"; echo "FAIL: 2 devices with ${mode}"; exit 1; }
  said="a reduce-scatter among the 2 devices (rank order); each copies out 1/2"
  [[ "${mode}" == devices ]] ||
    said="a reduce-scatter among the 2 devices (rank order) of every micro-batch's gradients"
  grep -qF "gradient reduction: ${said}" "${dir}/two_a2_${mode}.log" ||
    { cat "${dir}/two_a2_${mode}.log"; echo "FAIL: ${mode}: the run does not say how it reduced"; exit 1; }
  same_state "$(step "${dir}/one_a2" 3)" "$(step "${dir}/two_a2_${mode}" 3)" \
    "2 devices with ${mode} vs accumulation 2"
done
expect_refused "a bad --gradient_reduction" "${dir}/bad_reduction.log" \
  'gradient_reduction="nccl": must be host, devices, device_shards or auto' \
  "${train}" "${common[@]}" --accumulation=2 --devices=2 --gradient_reduction=nccl

# The bitwise checks are not vacuous: another accumulation ends elsewhere.
if cmp -s "$(step "${dir}/one_a2" 3)/model.safetensors" "$(step "${dir}/one_a6" 3)/model.safetensors"; then
  echo "FAIL: accumulation 2 and 6 ended at the same weights"; exit 1
fi

sed 's/"tie_word_embeddings": false/"tie_word_embeddings": true/' "${config}" >"${dir}/tied.json"
tied=(--config="${dir}/tied.json" "${common[@]:1}")
"${train}" "${tied[@]}" --accumulation=2 --checkpoint_dir="${dir}/tied_one" 2>"${dir}/tied_one.log"
"${train}" "${tied[@]}" --accumulation=2 --devices=2 --checkpoint_dir="${dir}/tied_two" \
  2>"${dir}/tied_two.log"
same_state "$(step "${dir}/tied_one" 3)" "$(step "${dir}/tied_two" 3)" \
  "tied embedding, 2 devices vs accumulation 2"

expect_refused "accumulation 3 over 2 devices" "${dir}/odd.log" \
  "--accumulation=3 must be a multiple of --devices=2" \
  "${train}" "${common[@]}" --accumulation=3 --devices=2
# Gradients on NVMe (in chunks of 1 MiB, several per layer of the built-in ~10M model): 2 devices
# end at the bits of one device with every gradient in RAM. The compute copy on NVMe is refused.
builtin=(--steps=2 --micro_batch=1 --seq_len=32 --accumulation=2 --eval_every=0 --warmup=1
  --threads=1 --optimizer_threads=1 --arena_mb=256)
nvme=(--nvme_mb=1000 --pinned_ram_mb=1000 --ram_mb=1000 --nvme_chunk_mb=1)
"${train}" "${builtin[@]}" --checkpoint_dir="${dir}/builtin_one" 2>"${dir}/builtin_one.log"
mkdir -p "${dir}/nvme"
"${train}" "${builtin[@]}" "${nvme[@]}" --grad_on_nvme --nvme_dir="${dir}/nvme" --devices=2 \
  --checkpoint_dir="${dir}/nvme_two" 2>"${dir}/nvme_two.log" ||
  { cat "${dir}/nvme_two.log"; echo "FAIL: 2 devices with gradients on NVMe"; exit 1; }
grep -q "^grad .*nvme" "${dir}/nvme_two.log" ||
  { cat "${dir}/nvme_two.log"; echo "FAIL: the gradients were not placed on NVMe"; exit 1; }
same_state "$(step "${dir}/builtin_one" 2)" "$(step "${dir}/nvme_two" 2)" \
  "2 devices with gradients on NVMe vs accumulation 2 in RAM"
expect_refused "the compute copy on NVMe on 2 devices" "${dir}/copy.log" \
  "devices=2 needs the compute copy in RAM.*memory.compute_copy_on_nvme" \
  "${train}" "${builtin[@]}" "${nvme[@]}" --master_on_nvme --compute_copy_on_nvme \
  --nvme_dir="${dir}/nvme" --devices=2
echo "PASS"
