"""resnet_common.py -- PyTorch's twin of resnet_common.lua: the seed's 18-layer residual
network for 32x32 inputs (3x3 stem of 16 filters, four stages of two basic blocks with
16/32/64/128 filters, stride 2 from the second stage, 1x1 projections with batch norm
where the shape changes, global average pooling, linear 10) and its SGD."""
import torch

nn = torch.nn
F = torch.nn.functional


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.short(x) if self.short is not None else x))


def resnet18():
    layers = [nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
    cin = 16
    for stage, cout in enumerate([16, 32, 64, 128]):
        for b in range(2):
            layers.append(Block(cin, cout, 2 if stage > 0 and b == 0 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10)]
    return nn.Sequential(*layers)


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
