"""TRL's ``GRPOTrainer`` trains with a pr_rlhf reward function (``pr_rlhf.integrations.trl.PersonalizedReward``):
two GRPO steps on CPU of the tiny model on a synthetic world's prompts, each completion scored for the user named by
the dataset's ``user_id`` column (here the world's exact judge, in this process); TRL logs the reward under the
function's name. The adapter's own behaviour (columns, the service route, failures) is in the unit tier."""
from __future__ import annotations

import warnings

import pytest

from pr_rlhf.configs.world import WorldConfig
from pr_rlhf.integrations.trl import PersonalizedReward
from tests.optional import need

need("trl")
WORLD = WorldConfig(users=4, cold_start_users=0, history_size=2, val_pairs_per_user=0, test_pairs_per_user=1)


def test_grpo_trainer_runs_two_steps_with_a_personalized_reward(tmp_path):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from pr_rlhf.models.prompting import load_tokenizer
    from pr_rlhf.models.sources import resolve_model
    from pr_rlhf.world import build_world

    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    world = build_world(WORLD)
    rows = [{"prompt": [{"role": "user", "content": p.question}], "user_id": p.user_id}
            for p in world.pairs if p.split == "train"][:8]
    reward = PersonalizedReward(reward={"kind": "gold", "world": WORLD.model_dump()}, name="personalized")
    model_dir = resolve_model("tiny")
    config = GRPOConfig(output_dir=str(tmp_path / "trl"), num_generations=4, per_device_train_batch_size=8,
                        gradient_accumulation_steps=1, max_completion_length=16, learning_rate=1e-5, beta=0.0,
                        max_steps=2, use_cpu=True, bf16=False, report_to="none", save_strategy="no",
                        logging_steps=1, disable_tqdm=True, seed=0, dataloader_num_workers=0,
                        remove_unused_columns=False)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                          reward_funcs=[reward], args=config, train_dataset=Dataset.from_list(rows),
                          processing_class=load_tokenizer(model_dir))
    trainer.train()
    logged = [h for h in trainer.state.log_history if "rewards/personalized/mean" in h]
    assert trainer.state.global_step == 2 and len(logged) == 2, trainer.state.log_history
    assert reward.failures == 0


def test_a_dataset_without_user_ids_is_refused_naming_the_column():
    reward = PersonalizedReward(reward={"kind": "gold", "world": WORLD.model_dump()})
    with pytest.raises(ValueError, match="no 'user_id' column"):
        reward(prompts=["q"], completions=["a"], query=["q"])
