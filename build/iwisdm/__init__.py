"""iWISDM: procedurally generated multi-frame instruction-following tasks (see docs/iwisdm.md).

Importing the package registers the ``iWISDM`` builder.
"""
from .builder import IWISDMBuilder
from .graph import AutoTask, Task, TaskSpace, ctx_dm, dms, load_task, two_back
from .instructions import InstructionParser, evaluate_instruction
from .io import generate_trials, read_trials, write_trials
from .operators import CONNECTIVITY, OPERATORS, register_operator
from .presets import PRESETS, PresetSampler, answer_vocabulary, get_preset
from .stimuli import DirectoryStimuli, ProceduralStimuli, load_stimuli
from .trial import Trial, TrialGenerator

__all__ = ["IWISDMBuilder", "AutoTask", "Task", "TaskSpace", "ctx_dm", "dms", "two_back", "load_task",
           "InstructionParser", "evaluate_instruction", "generate_trials", "read_trials", "write_trials",
           "CONNECTIVITY", "OPERATORS", "register_operator", "PRESETS", "PresetSampler", "answer_vocabulary",
           "get_preset", "DirectoryStimuli", "ProceduralStimuli", "load_stimuli", "Trial", "TrialGenerator"]
