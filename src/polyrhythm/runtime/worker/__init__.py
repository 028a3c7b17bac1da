"""A worker's side: the engine every worker loop runs on (engine.py), the Job a user's
script drives (script.py, with its optimizer's wrapper job_optimizer.py, the optimizer's
flat forms user_optimizer.py, its data shard script_data.py), polyrhythm train's built-in
job on that same Job (builtin.py, its epochs' validation epoch_validation.py), emulated
compute (compute.py), and what the workers must agree on (agreement.py)."""
