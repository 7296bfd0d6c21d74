import sys, glob
from gpuaccel import _C
import gpuaccel as ga
files=sorted(glob.glob("/tmp/benchdata/jpeg_folder_2000/class_00/*.jpg"))[:30]
datas=[open(f,"rb").read() for f in files]
t={"eval":ga.Compose([ga.Resize(256),ga.CenterCrop(224)]),"train":ga.Compose([ga.RandomResizedCrop(224),ga.RandomHorizontalFlip()])}[sys.argv[1]]
spec=ga.images._Pipeline(t).spec
for i in range(int(sys.argv[2])): _C._LoaderIter.decode_image(datas[i%30],spec,i)
