"""iWISDM: procedurally generated multi-frame instruction-following tasks (see docs/iwisdm.md).

Importing the package registers the ``iWISDM`` builder.
"""
from build.iwisdm.builder import IWISDMBuilder
from build.iwisdm.graph import AutoTask, Task, TaskSpace, ctx_dm, dms, load_task, two_back
from build.iwisdm.instructions import InstructionParser, evaluate_instruction
from build.iwisdm.io import generate_trials, read_trials, write_trials
from build.iwisdm.operators import CONNECTIVITY, OPERATORS, register_operator
from build.iwisdm.presets import PRESETS, PresetSampler, answer_vocabulary, get_preset
from build.iwisdm.stimuli import DirectoryStimuli, ProceduralStimuli, load_stimuli
from build.iwisdm.trial import Trial, TrialGenerator

__all__ = ["IWISDMBuilder", "AutoTask", "Task", "TaskSpace", "ctx_dm", "dms", "two_back", "load_task",
           "InstructionParser", "evaluate_instruction", "generate_trials", "read_trials", "write_trials",
           "CONNECTIVITY", "OPERATORS", "register_operator", "PRESETS", "PresetSampler", "answer_vocabulary",
           "get_preset", "DirectoryStimuli", "ProceduralStimuli", "load_stimuli", "Trial", "TrialGenerator"]
