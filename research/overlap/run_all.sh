make gpu-env >/dev/null 2>&1; export PYTHONPATH=$PWD/.gpu-site
for m in ${MODELS:-8b 70b}; do for f in ${FORMS:-fwd fwd+bwd}; do echo "== $m $f"; python3 research/overlap/ring_schedule.py --out $OUT/rings --model $m --form $f --iters ${ITERS:-30} 2>&1 | grep -v "^W1\|^I1" | tail -8; done; done
rm -f $OUT/rings/*.hlo.txt
