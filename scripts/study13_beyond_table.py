"""Stage 2 of the issue-13 study (slca_cond, slca_turn vs grpo), paired by seed over the seeds where all three finished.

    .venv/bin/python scripts/study13_beyond_table.py [beyond folder] [main folder]
"""
import json,os
from statistics import mean
from scipy import stats
import sys
B = sys.argv[1] if len(sys.argv) > 1 else 'docs/results/study13/beyond_partial'
M = sys.argv[2] if len(sys.argv) > 2 else 'docs/results/study13/main'
def fin(p):
    if not os.path.exists(p+'/metrics.jsonl'): return None, []
    rows=[json.loads(l) for l in open(p+'/metrics.jsonl') if l.strip()]
    ev=[r for r in rows if 'eval/success' in r and r['step']>=16]
    tool=[r['reward/tool'] for r in rows if isinstance(r.get('reward/tool'),float)]
    return (ev[-1] if ev else None), tool
seeds=[s for s in range(8) if all(fin(f'{B}/{e}-seed{s}')[0] for e in ('grpo','slca_cond','slca_turn'))]
print('seeds', seeds)
for s in seeds:
    g1,_=fin(f'{M}/grpo-seed{s}'); g2,_=fin(f'{B}/grpo-seed{s}')
    print(s, 'grpo stage1 vs stage2 success', round(g1['eval/success'],4), round(g2['eval/success'],4))
def t(v):
    n=len(v); m=mean(v); sd=(sum((x-m)**2 for x in v)/(n-1))**0.5; return m, stats.t.ppf(0.975,n-1)*sd/n**0.5
for e in ('slca_cond','slca_turn','slca'):
    cells=[]
    for k in ('eval/success','eval/tool_tasks/success','eval/arg_match','eval/reward_summary'):
        d=[fin(f'{B if e!="slca" else M}/{e}-seed{s}')[0][k]-fin(f'{B}/grpo-seed{s}')[0][k] for s in seeds]
        m,h=t(d); cells.append('%+.3f ± %.3f'%(m,h))
    d=[mean(fin(f'{B if e!="slca" else M}/{e}-seed{s}')[1])-mean(fin(f'{B}/grpo-seed{s}')[1]) for s in seeds]
    m,h=t(d); cells.append('%+.3f ± %.3f (%d/%d)'%(m,h,sum(x>0 for x in d),len(d)))
    print(f'| {e} - grpo (n={len(seeds)}) | '+' | '.join(cells)+' |')
