"""The default benchmark before and after a refactor: per (problem, backend, variant), each
run's speedup over XLA (measured in its own process), and the ratio of the two.

    python3 research/probes/house-2026-11-27/compare_runs.py BASE/results.csv NEW/results.csv
"""
import csv, statistics as st, sys
def load(p):
    rows={}
    for r in csv.DictReader(open(p)):
        if r['status']!='ok' or not r['speedup_vs_xla']: continue
        rows[(r['problem'], r['backend'], r['variant'])]=float(r['speedup_vs_xla'])
    return rows
a,b=load(sys.argv[1]),load(sys.argv[2])
keys=sorted(set(a)&set(b))
kern=[k for k in keys if k[1] in ('triton','pallas')]
auto=[k for k in keys if k[1]=='auto']
print(f"rows in both: {len(keys)} (kernel rows {len(kern)}, auto rows {len(auto)})")
for name,ks in (("kernel rows",kern),("auto rows",auto)):
    ra=[a[k] for k in ks]; rb=[b[k] for k in ks]; rr=[b[k]/a[k] for k in ks]
    q=st.quantiles(rr,n=10)
    print(f"{name}: median speedup vs XLA base {st.median(ra):.3f} new {st.median(rb):.3f}; "
          f"new/base per row: median {st.median(rr):.3f}, p10 {q[0]:.3f}, p90 {q[-1]:.3f}, min {min(rr):.3f}, max {max(rr):.3f}")
for k in kern+auto:
    r=b[k]/a[k]
    if r<0.93 or r>1.07: print("  outlier", k, f"base {a[k]:.3f} new {b[k]:.3f}")
