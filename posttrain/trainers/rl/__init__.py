"""What the RL trainers (``policy_gradient.py``: REINFORCE / RLOO / GRPO; ``ppo.py``) are made of.

    rollout.py          prompts -> G samples each -> rewards: one pure function of values, shared by GRPO and PPO,
                        with dynamic sampling (dynamic_sampling.py) and the prompt filter (prompt_filter.py) as parts
    rollout_engine.py   the policy's weights into the engine, samples out; pi_old against the sampler (TIS weights)
    streams.py          every random stream of a run, a function of (seed, step, round, rank, epoch)
    group.py            GRPO = rollout + reference log-probs + group advantages
    ppo_batch.py        PPO = rollout + pi_old / V_old recomputed by the update's forward + GAE
    critic.py           PPO's value model and its checkpoint files
    schedule.py         epochs x minibatches x micro-batches of one batch, under any number of processes
    ppo_distributed.py  the global batch's statistics under torchrun
    setup.py, common.py the run's set-up; the loop's parts (evaluation, checkpoints, the final model and summary)

Each trainer file keeps only what makes it its algorithm: its batch, its loss call, its update and its metrics.
"""
