// AMX one-token GEMV read rate (session 24, issue 14): a BF16 matrix read by the amx tier's tile walk (16-row
// tiles straight from the row-major matrix, 32 rows per block), by the same walk over a tile-major copy (each
// 16 x 32 tile contiguous), and by an avx512bf16 row kernel (4 rows x 32 columns per step). NM matrices cycled so
// that NM x rows x cols x 2 bytes exceeds the L3 (DRAM-resident) or not (L3-resident). Prints GB/s, best of 5.
//   g++ -O2 -std=c++20 scripts/perf/amx_stream_bench.cpp -o /tmp/amxsb && /tmp/amxsb 2048 2048 1 && /tmp/amxsb 2048 2048 64
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>
struct alignas(64) Cfg { uint8_t p=1,s=0; uint8_t r[14]={}; uint16_t cb[16]={}; uint8_t rows[16]={}; };
__attribute__((target("amx-tile,amx-bf16,avx512f")))
void cfg(){ static Cfg c; for(int t=0;t<8;++t){c.cb[t]=64;c.rows[t]=16;} _tile_loadconfig(&c);}
// rows x cols bf16 row-major, one token B packed (steps x 512 u16)
__attribute__((target("amx-tile,amx-bf16,avx512f")))
void gemv_rm(const uint16_t* W,int64_t rows,int64_t cols,const uint16_t* b,float* y){
  int64_t steps=cols/32; alignas(64) float c[256];
  for(int64_t r=0;r<rows;r+=32){ _tile_zero(0);_tile_zero(2);
    for(int64_t s=0;s<steps;++s){ _tile_loadd(4,W+r*cols+s*32,cols*2); _tile_loadd(6,b+s*512,64); _tile_dpbf16ps(0,4,6);
      _tile_loadd(5,W+(r+16)*cols+s*32,cols*2); _tile_dpbf16ps(2,5,6);}
    _tile_stored(0,c,64); for(int i=0;i<16;++i) y[r+i]=c[i*16]; _tile_stored(2,c,64); for(int i=0;i<16;++i) y[r+16+i]=c[i*16];}
}
// tile-major: [rowblock16][step][16 rows][32 cols]
__attribute__((target("amx-tile,amx-bf16,avx512f")))
void gemv_tm(const uint16_t* W,int64_t rows,int64_t cols,const uint16_t* b,float* y){
  int64_t steps=cols/32; alignas(64) float c[256];
  for(int64_t r=0;r<rows;r+=32){ _tile_zero(0);_tile_zero(2);
    const uint16_t* a0=W+r*cols; const uint16_t* a1=W+(r+16)*cols;
    for(int64_t s=0;s<steps;++s){ _tile_loadd(4,a0+s*512,64); _tile_loadd(6,b+s*512,64); _tile_dpbf16ps(0,4,6);
      _tile_loadd(5,a1+s*512,64); _tile_dpbf16ps(2,5,6);}
    _tile_stored(0,c,64); for(int i=0;i<16;++i) y[r+i]=c[i*16]; _tile_stored(2,c,64); for(int i=0;i<16;++i) y[r+16+i]=c[i*16];}
}
// avx512bf16 row-at-a-time 4 rows
__attribute__((target("avx512f,avx512bf16,avx512bw")))
void gemv_avx(const uint16_t* W,int64_t rows,int64_t cols,const uint16_t* x,float* y){
  for(int64_t r=0;r<rows;r+=4){ __m512 a0=_mm512_setzero_ps(),a1=a0,a2=a0,a3=a0;
    for(int64_t k=0;k<cols;k+=32){ __m512bh xv=(__m512bh)_mm512_loadu_si512(x+k);
      a0=_mm512_dpbf16_ps(a0,(__m512bh)_mm512_loadu_si512(W+r*cols+k),xv);
      a1=_mm512_dpbf16_ps(a1,(__m512bh)_mm512_loadu_si512(W+(r+1)*cols+k),xv);
      a2=_mm512_dpbf16_ps(a2,(__m512bh)_mm512_loadu_si512(W+(r+2)*cols+k),xv);
      a3=_mm512_dpbf16_ps(a3,(__m512bh)_mm512_loadu_si512(W+(r+3)*cols+k),xv);}
    y[r]=_mm512_reduce_add_ps(a0);y[r+1]=_mm512_reduce_add_ps(a1);y[r+2]=_mm512_reduce_add_ps(a2);y[r+3]=_mm512_reduce_add_ps(a3);}
}
int main(int argc,char**argv){
  if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) { fprintf(stderr, "AMX tile data refused\n"); return 1; }
  int64_t rows=atoi(argv[1]),cols=atoi(argv[2]),nm=atoi(argv[3]);
  size_t per=rows*cols; std::vector<uint16_t> W(per*nm); for(size_t i=0;i<W.size();++i) W[i]=0x3f00+(i*7919%97);
  std::vector<uint16_t> b(cols/32*512,0x3f80), x(cols,0x3f80); std::vector<float> y(rows);
  cfg();
  for(int mode=0;mode<3;++mode){ double best=1e9;
    for(int rep=0;rep<5;++rep){ auto t0=std::chrono::steady_clock::now();
      for(int m=0;m<nm;++m){ const uint16_t* w=W.data()+m*per; if(mode==0)gemv_rm(w,rows,cols,b.data(),y.data()); else if(mode==1) gemv_tm(w,rows,cols,b.data(),y.data()); else gemv_avx(w,rows,cols,x.data(),y.data());}
      double dt=std::chrono::duration<double>(std::chrono::steady_clock::now()-t0).count(); if(dt<best)best=dt;}
    printf("%s %ldx%ld x%ld: %.1f GB/s\n",mode==0?"amx rowmajor":mode==1?"amx tilemajor":"avx512bf16",rows,cols,nm,per*2.0*nm/best/1e9);}
}
