# Sourced by assemble.sh and check_ldd.sh: the shared libraries a GPU kit takes from the machine
# rather than carrying: glibc's own, the C++ runtime (GCC 12's or newer, GLIBCXX_3.4.30), and
# CUDA's (toolkit, driver or pip's nvidia-* wheels). Every other library travels in lib/.
machine_libs='^(linux-vdso\.so\.1|ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|libresolv\.so\.2|libutil\.so\.1|libstdc\+\+\.so\.6|libgcc_s\.so\.1|libcuda\.so\.1|libcudart\.so\.[0-9]+|libcublas(Lt)?\.so\.[0-9]+|libcudnn[a-z_]*\.so\.[0-9]+|libnccl\.so\.[0-9]+)$'
