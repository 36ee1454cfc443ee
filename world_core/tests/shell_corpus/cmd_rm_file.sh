touch x y
rm x
ls
