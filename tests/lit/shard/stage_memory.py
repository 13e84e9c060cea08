"""stage_memory.py ONE.json PIPE.json: what each pipeline stage's devices hold.
ONE is a model's one-device plan, PIPE the same model on a pipeline. Per
stage: its slab (stage_slab_bytes), the bytes of the parameters it owns, of
the parameters it receives from another stage (a tied weight's copy), and of
its persistent tensors (params and optimizer state it owns, and what every
stage holds), each also as a share of the one-device plan's. Then checks that
every stage owns 15% to 40% of the parameter bytes and that its slab is
smaller than the one-device slab (a verdict line), and that the stages' own
parameters sum to the model's: each parameter on exactly one stage (exit
status 1 when not)."""
import json
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def role_bytes(plan, roles, stage=None):
    return sum(t['bytes'] for t in plan['tensors']
               if t['role'] in roles and (stage is None or t.get('stage', -1) == stage))


def tied_copies(plan, stage):
    """Bytes received on stage whose sender's tensor is a parameter."""
    tensors = plan['tensors']
    sent = {i['tag']: i['args'][0] for i in plan['instrs']
            if i['kind'] == 'collective' and i['op'] == 'send'}
    return sum(tensors[i['args'][0]]['bytes'] for i in plan['instrs']
               if i['kind'] == 'collective' and i['op'] == 'recv' and i.get('stage', 0) == stage
               and tensors[sent[i['tag']]]['role'] == 'param')


def main():
    one, pipe = load(sys.argv[1]), load(sys.argv[2])
    persistent = ('param', 'state', 'input', 'step', 'hyper', 'coord')
    params = role_bytes(one, ('param',))
    whole = role_bytes(one, persistent)
    common = role_bytes(pipe, persistent, -1)
    slabs, share, owned, copies = pipe['stage_slab_bytes'], True, 0, 0
    print('one device: params %d bytes, persistent %d, slab %d' %
          (params, whole, one['slab_bytes']))
    for s, slab in enumerate(slabs):
        own = role_bytes(pipe, ('param',), s)
        tied = tied_copies(pipe, s)
        held = role_bytes(pipe, ('param', 'state'), s) + common
        print('stage %d: slab %d, params %d (%.1f%%) + tied copies %d, persistent %d (%.1f%%)' %
              (s, slab, own, 100.0 * own / params, tied, held, 100.0 * held / whole))
        share &= 0.15 * params <= own <= 0.40 * params and slab < one['slab_bytes']
        owned += own
        copies += tied
    print('stages own %d parameter bytes, %s; tied copies %d' %
          (owned, 'the whole model' if owned == params else 'not the model', copies))
    print('each stage within 15-40%% of the parameters: %s' % ('yes' if share else 'no'))
    return 0 if owned == params else 1


sys.exit(main())
