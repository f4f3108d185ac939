"""eager: the model as written. The baseline every other mode is compared with."""
from fusebench.modes.registry import register_mode
from fusebench.modes.base import Mode


@register_mode
class Eager(Mode):
    name = "eager"
    same_plan_with_input_grads = True   # no guards: a module run eagerly
    description = "plain PyTorch eager execution (baseline)"

    def prepare(self, model, example_inputs, options, events):
        return model
