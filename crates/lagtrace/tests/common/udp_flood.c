// A UDP flood for the kernel-stack tests (diagnose_kernel.rs): Ethernet frames written
// straight to a device through an AF_PACKET socket (qdisc bypassed, 64 frames a sendmmsg),
// cheap to send, so that one sender keeps another CPU's receive softirq busy. Bounded: it
// stops by itself after SECONDS.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static unsigned short csum(const void *p, int n) {
  const unsigned short *w = p; unsigned long s = 0;
  for (; n > 1; n -= 2) s += *w++;
  if (n) s += *(const unsigned char *)w;
  while (s >> 16) s = (s & 0xffff) + (s >> 16);
  return ~s;
}

int main(int argc, char **argv) {
  if (argc < 7) { fprintf(stderr, "usage: flood IFACE DSTMAC SRCIP DSTIP PORT SECONDS [PAYLOAD]\n"); return 2; }
  int payload = argc > 7 ? atoi(argv[7]) : 18;
  int fd = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_IP));
  if (fd < 0) { perror("socket"); return 1; }
  int one = 1;
  setsockopt(fd, SOL_PACKET, PACKET_QDISC_BYPASS, &one, sizeof one);
  struct ifreq ifr = {0}; strncpy(ifr.ifr_name, argv[1], IFNAMSIZ - 1);
  if (ioctl(fd, SIOCGIFINDEX, &ifr) < 0) { perror("ifindex"); return 1; }
  int ifindex = ifr.ifr_ifindex;
  if (ioctl(fd, SIOCGIFHWADDR, &ifr) < 0) { perror("hwaddr"); return 1; }
  unsigned char frame[1600]; memset(frame, 0, sizeof frame);
  struct ether_header *eh = (void *)frame;
  sscanf(argv[2], "%hhx:%hhx:%hhx:%hhx:%hhx:%hhx", &eh->ether_dhost[0], &eh->ether_dhost[1],
         &eh->ether_dhost[2], &eh->ether_dhost[3], &eh->ether_dhost[4], &eh->ether_dhost[5]);
  memcpy(eh->ether_shost, ifr.ifr_hwaddr.sa_data, 6);
  eh->ether_type = htons(ETH_P_IP);
  struct iphdr *ip = (void *)(frame + sizeof *eh);
  ip->version = 4; ip->ihl = 5; ip->ttl = 64; ip->protocol = IPPROTO_UDP;
  ip->saddr = inet_addr(argv[3]); ip->daddr = inet_addr(argv[4]);
  ip->tot_len = htons(sizeof *ip + sizeof(struct udphdr) + payload);
  ip->check = csum(ip, sizeof *ip);
  struct udphdr *u = (void *)(ip + 1);
  u->source = htons(40000); u->dest = htons(atoi(argv[5]));
  u->len = htons(sizeof *u + payload); u->check = 0;
  int len = sizeof *eh + sizeof *ip + sizeof *u + payload;
  struct sockaddr_ll to = {.sll_family = AF_PACKET, .sll_ifindex = ifindex, .sll_halen = 6};
  memcpy(to.sll_addr, eh->ether_dhost, 6);
  enum { B = 64 };
  struct iovec iov[B]; struct mmsghdr m[B];
  for (int i = 0; i < B; i++) {
    iov[i] = (struct iovec){frame, len};
    m[i] = (struct mmsghdr){.msg_hdr = {.msg_name = &to, .msg_namelen = sizeof to, .msg_iov = &iov[i], .msg_iovlen = 1}};
  }
  struct timespec t0, t; clock_gettime(CLOCK_MONOTONIC, &t0);
  double secs = atof(argv[6]); unsigned long sent = 0;
  for (unsigned long i = 0;; i++) {
    int n = sendmmsg(fd, m, B, 0);
    if (n > 0) sent += n;
    if ((i & 63) == 0) {
      clock_gettime(CLOCK_MONOTONIC, &t);
      if ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 >= secs) break;
    }
  }
  printf("%lu packets\n", sent);
  return 0;
}
