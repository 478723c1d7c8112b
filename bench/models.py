"""Benchmark models in plain torch.nn (torchvision is not installable beside torch 2.13)."""
from torch import nn


def _conv_bn(cin, cout, k=3, stride=1, groups=1, act=nn.ReLU6):
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act(inplace=True))
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = cin * expand
        self.use_res = stride == 1 and cin == cout
        layers = [] if expand == 1 else [_conv_bn(cin, hidden, 1)]
        layers += [_conv_bn(hidden, hidden, 3, stride, groups=hidden), _conv_bn(hidden, cout, 1, act=None)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    """MobileNetV2 (width 1.0, 224x224, 1000 classes), the torchvision architecture."""

    def __init__(self, num_classes=1000):
        super().__init__()
        cfg = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
               (6, 320, 1, 1)]
        layers, cin = [_conv_bn(3, 32, 3, 2)], 32
        for t, c, n, s in cfg:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(_conv_bn(cin, 1280, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x).mean((2, 3)))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    """ResNet-18 (224x224, 1000 classes), the torchvision architecture."""

    def __init__(self, num_classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], 64
        for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


def speech_mlp(features=80, width=2048, depth=7, outputs=4000):
    """A speech-style acoustic model: frames x features -> Linear(width) x depth (ReLU) -> outputs."""
    layers, cin = [], features
    for _ in range(depth):
        layers += [nn.Linear(cin, width), nn.ReLU()]
        cin = width
    layers.append(nn.Linear(cin, outputs))
    return nn.Sequential(*layers)


class UNetLike(nn.Module):
    """A small U-Net: three 3x3 convolutions down (to 128 channels at 1/4 size), up by
    bilinear and nearest resizes, each concatenated with the skip connection of its
    size and convolved, a 1x1 to 2 output channels."""

    def __init__(self):
        super().__init__()
        self.d1, self.d2 = nn.Conv2d(3, 32, 3, 1, 1), nn.Conv2d(32, 64, 3, 2, 1)
        self.d3 = nn.Conv2d(64, 128, 3, 2, 1)
        self.u2, self.u1 = nn.Conv2d(128 + 64, 64, 3, 1, 1), nn.Conv2d(64 + 32, 32, 3, 1, 1)
        self.out = nn.Conv2d(32, 2, 1)

    def forward(self, x):
        import torch
        import torch.nn.functional as F
        a = F.relu(self.d1(x))
        b = F.relu(self.d2(a))
        c = F.relu(self.d3(b))
        u = F.relu(self.u2(torch.cat([F.interpolate(c, scale_factor=2.0, mode="bilinear", align_corners=False), b], 1)))
        u = F.relu(self.u1(torch.cat([F.interpolate(u, scale_factor=2.0, mode="nearest"), a], 1)))
        return self.out(u)


class UNetTranspose(nn.Module):
    """UNetLike with ConvTranspose2d 2x2 / 2 upsampling (a U-Net's usual), at 128² in."""

    def __init__(self):
        super().__init__()
        self.d1, self.d2 = nn.Conv2d(3, 32, 3, 1, 1), nn.Conv2d(32, 64, 3, 2, 1)
        self.d3 = nn.Conv2d(64, 128, 3, 2, 1)
        self.t2, self.u2 = nn.ConvTranspose2d(128, 64, 2, 2), nn.Conv2d(128, 64, 3, 1, 1)
        self.t1, self.u1 = nn.ConvTranspose2d(64, 32, 2, 2), nn.Conv2d(64, 32, 3, 1, 1)
        self.out = nn.Conv2d(32, 2, 1)

    def forward(self, x):
        import torch
        import torch.nn.functional as F
        a = F.relu(self.d1(x))
        b = F.relu(self.d2(a))
        c = F.relu(self.d3(b))
        u = F.relu(self.u2(torch.cat([self.t2(c), b], 1)))
        u = F.relu(self.u1(torch.cat([self.t1(u), a], 1)))
        return self.out(u)


class Conv1dAudio(nn.Module):
    """A 1-D convolutional acoustic model: [N, 80 features, frames] -> a 5-tap
    Conv1d to 256 channels, a 5-tap depthwise Conv1d with BatchNorm, a pointwise
    Conv1d (ReLUs between), then a Linear per frame to 40 classes."""

    def __init__(self, features=80, width=256, classes=40):
        super().__init__()
        self.convs = nn.Sequential(
            nn.Conv1d(features, width, 5, padding=2), nn.ReLU(),
            nn.Conv1d(width, width, 5, padding=2, groups=width), nn.BatchNorm1d(width), nn.ReLU(),
            nn.Conv1d(width, width, 1), nn.ReLU())
        self.out = nn.Linear(width, classes)

    def forward(self, x):
        return self.out(self.convs(x).transpose(1, 2))


def transformer_encoder(d_model=256, heads=4, ff=1024, layers=4):
    """nn.TransformerEncoder as a model of one's own builds it: post-norm GELU layers,
    batch first, a final LayerNorm."""
    import warnings
    layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.1, activation="gelu", batch_first=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        enc = nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(d_model))
    for m in enc.modules():  # the layers are copies of one: each its own weights, as trained ones
        if isinstance(m, nn.Linear):
            m.reset_parameters()
        elif isinstance(m, nn.MultiheadAttention):
            m._reset_parameters()
    return enc


def trained_like(model, example_shape, batches=4, seed=0):
    """Gives a randomly initialised conv net the statistics of a trained one, so that
    activations neither vanish nor explode through depth (with PyTorch's default init
    MobileNetV2's logits collapse to the classifier bias and every int8 error looks
    tiny): torchvision's init (Kaiming normal fan-out convs, N(0, 0.01) Linear, zero
    biases), then BatchNorm running statistics estimated on random batches in train
    mode (cumulative average), so the folded BatchNorms are not identities."""
    import torch
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, (nn.Conv1d, nn.Conv2d)):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", generator=g)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0, 0.01, generator=g)
            if m.bias is not None:  # (torchvision's Swin has bias-free Linears)
                nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            m.reset_running_stats()
            m.momentum = None
            with torch.no_grad():
                m.weight.uniform_(0.5, 1.5, generator=g)
                m.bias.uniform_(-0.2, 0.2, generator=g)
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(*example_shape, generator=g))
    for m in model.modules():
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            m.momentum = 0.1
    return model.eval()
