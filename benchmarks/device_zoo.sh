#!/usr/bin/env bash
# Rebuild some of the zoo's members on a lent GPU machine, in parallel, then (time allowing)
# run `ptc bench --quick` and `ptc paper` there. This is the one prepared script a device lease
# runs (see the README's "Zoo" section); it also runs on a CPU machine, just slower.
#
# Each member is built in a zoo of its own (`ptc zoo build --member NAME`: the world, then
# pretraining, quality, sources, descriptors), and `ptc zoo merge` swaps it into a copy of the
# given zoo. Everything that comes back is under $OUT, as one tar split into
# parts of at most 15 MiB (the device tool's per-file limit), plus the log:
#
#   cat $OUT/zoo.tar.* | tar -x -C zoo       (zoo.json, models/M, sources/M, bank/descriptors)
#
# Environment: MEMBERS (default "vit siglip eva"), PROFILE (full), ZOO (zoo), BUDGET
# (seconds for the whole script, default 560), THREADS (CPU threads per build, default 5),
# BENCH (1: run the benchmark; 0: skip it), FRESH (1: a zoo whose world changed, so nothing of
# ZOO can be kept: the first member's zoo is the base, the others are merged into it, and every
# member is packed), SPLIT (the split `ptc paper` scores: test, or train to judge a zoo change
# before its test figures are seen), WORK (where the builds go; a second call with the same WORK
# continues them, since builds are resumable), TRIAL (arguments for benchmarks/rebuild_trial.py,
# e.g. "--longer 1.5": each member is built that way instead of by the profile; use with FRESH=1,
# every member and SPLIT=train).
set -u
start=$SECONDS
members=${MEMBERS:-vit siglip eva}
profile=${PROFILE:-full}
zoo=${ZOO:-zoo}
budget=${BUDGET:-560}
threads=${THREADS:-5}
out=${OUT:-/tmp/ptc-device-out}
work=${WORK:-$(mktemp -d)}
mkdir -p "$out" "$work"
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
ptc() { python3 -m ptc.compiler.cli "$@"; }  # `timeout` cannot run a function: the timed calls spell it out
left() { echo $((budget - (SECONDS - start))); }
say() { echo "[$((SECONDS - start))s] $*"; }

exec > >(tee "$out/run.log") 2>&1
gpu=$(nvidia-smi -L 2>/dev/null | head -1)
say "machine: ${gpu:-no GPU}; $(nproc) CPUs"
python3 -c "import torch, transformers, peft, open_clip, onnxruntime
print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__,
      'peft', peft.__version__, 'open_clip', open_clip.__version__, 'onnxruntime', onnxruntime.__version__)" || exit 1

builds=()
for m in $members; do  # each in a zoo of its own: parallel builds cannot race on one zoo.json
    say "build $m -> $work/zoo-$m"
    if [ -n "${TRIAL:-}" ]; then  # word-split on purpose: TRIAL holds several arguments
        build=(python3 -m ptc.lab.benchmarks.rebuild_trial $TRIAL --zoo "$zoo" --work "$work/zoo-$m" --members "$m")
    else
        build=(python3 -m ptc.compiler.cli zoo build --profile "$profile" --root "$work/zoo-$m" --member "$m")
    fi
    OMP_NUM_THREADS=$threads timeout $(( $(left) - 40 )) "${build[@]}" > "$work/build-$m.log" 2>&1 &
    builds+=($!)
done
wait "${builds[@]}"  # not a bare `wait`: that also waits for the log's tee, which never ends
for m in $members; do say "build $m:"; cat "$work/build-$m.log"; done

# The merged zoo: the given one with each rebuilt member swapped in (a member whose build did
# not finish is refused by the merge and stays as it was).
merged=$work/merged
rm -rf "$merged"
if [ "${FRESH:-0}" = 1 ]; then
    first=${members%% *}
    cp -r "$work/zoo-$first" "$merged"
    for m in ${members#"$first"}; do ptc zoo merge "$work/zoo-$m" --member "$m" --root "$merged"; done
else
    cp -r "$zoo" "$merged"
    for m in $members; do ptc zoo merge "$work/zoo-$m" --member "$m" --root "$merged"; done
fi
rebuilt=$(for m in $members; do [ -d "$merged/models/$m" ] && echo models/$m sources/$m; done)
(cd "$merged" && tar -cf "$work/zoo.tar" zoo.json $rebuilt bank/descriptors) && split -b 15m -d "$work/zoo.tar" "$out/zoo.tar."
say "merged zoo packed: $(ls "$out" | tr '\n' ' ')"

if [ "${BENCH:-1}" = 1 ] && [ "$(left)" -gt 200 ]; then
    say "bench --quick"
    timeout $(( $(left) - 100 )) python3 -m ptc.compiler.cli bench --quick --out "$out/bench-quick.json"
fi
if [ "$(left)" -gt 90 ]; then
    say "paper on the merged zoo"
    mkdir -p "$work/paper"
    OMP_NUM_THREADS=$(nproc) timeout $(( $(left) - 20 )) python3 -m ptc.compiler.cli paper --profile "$profile" --root "$merged" --out "$work/paper" \
        --split "${SPLIT:-test}" > "$work/paper/paper.log" 2>&1; (cd "$work" && tar -cf "$out/paper.tar" paper)
    tail -30 "$work/paper/paper.log"
fi
say "done"
