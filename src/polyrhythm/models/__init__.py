"""Models, by name. A model is declared here with its own settings; its builder takes the
sample shape and class count and returns an nn.Module, named lazily so that checking a config
or listing models imports neither torch nor the builders. A new model is a builder and one
`MODELS.register` line; a user's own is any "package.module:function" taking (shape, classes)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from polyrhythm.settings import Component, Registry


@dataclass(frozen=True)
class ModelSpec(Component):
    """A registered model: `builder(shape, classes, **its settings)` returns an nn.Module
    (or names one as "package.module:function"). `parameters` is its parameter count for a
    3×32×32 sample and 10 classes, declared so that listing models needs no torch (a test
    checks it against the built model)."""

    builder: str | Callable = ""
    parameters: int | None = None


MODELS: Registry[ModelSpec] = Registry("model", custom=lambda reference: ModelSpec(
    reference, "your function: (sample shape, classes) -> nn.Module", builder=reference))

SMALL, RESNET, CLASSIC = (f"polyrhythm.models.{m}" for m in ("small", "resnet", "classic"))
HE = "He et al. 2016, Deep Residual Learning for Image Recognition"

MODELS.register(ModelSpec("cnn", "two 3x3 conv blocks (16, 32 channels) with max-pooling, "
                          "then a 64-unit head", builder=f"{SMALL}:cnn", parameters=136_874))
MODELS.register(ModelSpec("mlp", "two hidden layers of 128 and 64 units",
                          builder=f"{SMALL}:mlp", parameters=402_250))
TABULAR, SPARK_STUDY = ("polyrhythm.models.tabular",
                        "the asynchronous-training thesis's Spark MLlib against parameter "
                        "server study")
MODELS.register(ModelSpec("linear", "one linear layer: linear regression with --loss mse, "
                          "logistic regression with bce, softmax regression with "
                          "cross_entropy", source=SPARK_STUDY, builder=f"{TABULAR}:linear",
                          parameters=30_730))
MODELS.register(ModelSpec("perceptron", "two hidden layers of 15 sigmoid units, as Spark "
                          "MLlib's perceptron (28-15-15-2 on HIGGS)", source=SPARK_STUDY,
                          builder=f"{TABULAR}:perceptron", parameters=46_495))
for depth, blocks, count in [(20, 3, 269_722), (32, 5, 464_154), (56, 9, 853_018)]:
    MODELS.register(ModelSpec(
        f"resnet{depth}", f"CIFAR ResNet-{depth}: a 3x3 conv of 16 channels, three stages of "
        f"{blocks} basic blocks (16, 32, 64 channels), parameter-free shortcuts", source=HE,
        builder=f"{RESNET}:resnet{depth}", parameters=count))
MODELS.register(ModelSpec(
    "resnet18", "ResNet-18 for 32x32 images: a 3x3 stem of 64 channels, four stages of 2 "
    "basic blocks (64 to 512 channels), projection shortcuts", source=HE,
    builder=f"{RESNET}:resnet18", parameters=11_173_962))
MODELS.register(ModelSpec(
    "resnet50", "ResNet-50 for 32x32 images: a 3x3 stem of 64 channels, stages of 3, 4, 6, 3 "
    "bottleneck blocks (256 to 2048 channels)", source=HE,
    builder=f"{RESNET}:resnet50", parameters=23_520_842))
MODELS.register(ModelSpec(
    "vgg16", "VGG-16 with BatchNorm for 32x32 images: thirteen 3x3 convs (64 to 512 "
    "channels) in five max-pooled blocks, one linear layer",
    source="Simonyan & Zisserman 2015, Very Deep Convolutional Networks for Large-Scale "
    "Image Recognition", builder=f"{CLASSIC}:vgg16", parameters=14_724_042))
MODELS.register(ModelSpec(
    "alexnet", "AlexNet for 32x32 images: five convs (64, 192, 384, 256, 256 channels) with "
    "response normalisation and max-pooling, a 1024-1024 head with dropout",
    source="Krizhevsky et al. 2012, ImageNet Classification with Deep Convolutional Neural "
    "Networks", builder=f"{CLASSIC}:alexnet", parameters=4_560_714))
MODELS.register(ModelSpec(
    "inception", "GoogLeNet (Inception-v1) for 32x32 images: a 3x3 stem of 192 channels, "
    "inception modules 3a-5b with BatchNorm", source="Szegedy et al. 2015, Going Deeper with "
    "Convolutions", builder=f"{CLASSIC}:inception", parameters=5_871_914))
