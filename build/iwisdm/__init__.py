"""iWISDM: procedurally generated multi-frame instruction-following tasks (see docs/iwisdm.md).

Importing the package registers the ``iWISDM`` builder.
"""
from reform_eval.build.iwisdm.builder import IWISDMBuilder
from reform_eval.build.iwisdm.graph import AutoTask, Task, TaskSpace, ctx_dm, dms, load_task, two_back
from reform_eval.build.iwisdm.instructions import InstructionParser, evaluate_instruction
from reform_eval.build.iwisdm.io import generate_trials, read_trials, write_trials
from reform_eval.build.iwisdm.operators import CONNECTIVITY, OPERATORS, register_operator
from reform_eval.build.iwisdm.presets import PRESETS, PresetSampler, answer_vocabulary, get_preset
from reform_eval.build.iwisdm.stimuli import DirectoryStimuli, ProceduralStimuli, load_stimuli
from reform_eval.build.iwisdm.trial import Trial, TrialGenerator

__all__ = ["IWISDMBuilder", "AutoTask", "Task", "TaskSpace", "ctx_dm", "dms", "two_back", "load_task",
           "InstructionParser", "evaluate_instruction", "generate_trials", "read_trials", "write_trials",
           "CONNECTIVITY", "OPERATORS", "register_operator", "PRESETS", "PresetSampler", "answer_vocabulary",
           "get_preset", "DirectoryStimuli", "ProceduralStimuli", "load_stimuli", "Trial", "TrialGenerator"]
